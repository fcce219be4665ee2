package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// APIListResult is the API side of a cold start at one size, timed with a bare client in
// the same run, so that a proxy's cold start can be split into the apiserver's part and
// its own: what the proxy cannot go below, whatever it does with the objects.
type APIListResult struct {
	Services int `json:"services"`
	// Objects is the number of Services and EndpointSlices listed.
	Objects int `json:"objects"`
	// ListSeconds is a LIST of all Services and one of all EndpointSlices, one after the
	// other, as protobuf from the watch cache (resourceVersion=0), until the last byte
	// arrived; ListBytes their size. DecodeSeconds is decoding those bodies into typed
	// objects, apart.
	ListSeconds   float64 `json:"listSeconds"`
	ListBytes     int64   `json:"listBytes"`
	DecodeSeconds float64 `json:"decodeSeconds"`
	// WatchListSeconds is what informers do by default from client-go 1.35
	// (WatchListClient): a watch of each resource with sendInitialEvents until the
	// bookmark that ends the initial events, decoded; both, one after the other.
	WatchListSeconds float64 `json:"watchListSeconds"`
	Repeat           int     `json:"repeat"`
}

// timeAPIList times listing the dataset o.apiListRepeat times as the proxies' identity
// (system:kube-proxy) with protobuf, and keeps the medians.
func (b *bench) timeAPIList(ctx context.Context, size int) (APIListResult, error) {
	res := APIListResult{Services: size, Repeat: b.o.apiListRepeat}
	if b.o.apiListRepeat < 1 {
		return res, nil
	}
	cfg := b.cp.ProxyRESTConfig()
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = cfg.ContentType
	cfg.QPS, cfg.Burst = 100, 100
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return res, err
	}
	var list, decode, watchList []float64
	for range b.o.apiListRepeat {
		l, d, bytes, objects, err := rawList(ctx, kube)
		if err != nil {
			return res, err
		}
		w, wObjects, err := watchListAll(ctx, kube)
		if err != nil {
			return res, err
		}
		if wObjects != objects {
			return res, fmt.Errorf("a LIST gave %d objects, a watch-list %d", objects, wObjects)
		}
		list, decode, watchList = append(list, l.Seconds()), append(decode, d.Seconds()), append(watchList, w.Seconds())
		res.ListBytes, res.Objects = bytes, objects
	}
	res.ListSeconds, res.DecodeSeconds, res.WatchListSeconds = median(list), median(decode), median(watchList)
	return res, nil
}

// rawList LISTs Services and EndpointSlices from the watch cache, then decodes the bodies.
func rawList(ctx context.Context, kube kubernetes.Interface) (fetch, decode time.Duration, bytes int64, objects int, err error) {
	var bodies [][]byte
	start := time.Now()
	for _, l := range []struct {
		client   rest.Interface
		resource string
	}{{kube.CoreV1().RESTClient(), "services"}, {kube.DiscoveryV1().RESTClient(), "endpointslices"}} {
		resource := l.resource
		body, err := l.client.Get().Resource(resource).
			VersionedParams(&metav1.ListOptions{ResourceVersion: "0"}, scheme.ParameterCodec).
			Timeout(5 * time.Minute).Do(ctx).Raw()
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("listing %s: %w", resource, err)
		}
		bodies = append(bodies, body)
		bytes += int64(len(body))
	}
	fetch = time.Since(start)
	start = time.Now()
	for _, body := range bodies {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			return 0, 0, 0, 0, fmt.Errorf("decoding a list: %w", err)
		}
		objects += meta.LenList(obj)
	}
	return fetch, time.Since(start), bytes, objects, nil
}

// watchListAll streams Services, then EndpointSlices, with sendInitialEvents until each
// stream's initial-events-end bookmark.
func watchListAll(ctx context.Context, kube kubernetes.Interface) (time.Duration, int, error) {
	opts := metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
		TimeoutSeconds:       ptr.To[int64](300),
	}
	start := time.Now()
	objects := 0
	for _, open := range []func() (watch.Interface, error){
		func() (watch.Interface, error) { return kube.CoreV1().Services("").Watch(ctx, opts) },
		func() (watch.Interface, error) { return kube.DiscoveryV1().EndpointSlices("").Watch(ctx, opts) },
	} {
		w, err := open()
		if err != nil {
			return 0, 0, fmt.Errorf("watch-list: %w", err)
		}
		n, err := untilInitialEventsEnd(w)
		w.Stop()
		if err != nil {
			return 0, 0, err
		}
		objects += n
	}
	return time.Since(start), objects, nil
}

// untilInitialEventsEnd counts the objects a watch-list sends until its end bookmark.
func untilInitialEventsEnd(w watch.Interface) (int, error) {
	n := 0
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added:
			n++
		case watch.Bookmark:
			m, err := meta.Accessor(ev.Object)
			if err != nil {
				return n, err
			}
			if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
				return n, nil
			}
		case watch.Error:
			return n, fmt.Errorf("watch-list: error event: %v", ev.Object)
		}
	}
	return n, fmt.Errorf("watch-list: the stream ended after %d objects without the initial-events-end bookmark", n)
}
