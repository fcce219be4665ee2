package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// syncedMarkers are the log lines (klog text format, verbosity 0) that say a proxy has
// received every Service and EndpointSlice: from there on, the cold start is the proxy's
// own work. sluice logs one line once both informers have synced; upstream logs one per
// informer (client-go's WaitForNamedCacheSync, which polls every 100ms), and the later of
// the two counts.
var syncedMarkers = map[string][]string{
	proxySluice:   {"Services and EndpointSlices received"},
	proxyUpstream: {`"Caches are synced" controller="service config"`, `"Caches are synced" controller="endpoint slice config"`},
}

// klogHeader matches the start of a klog text line: Lmmdd hh:mm:ss.uuuuuu.
var klogHeader = regexp.MustCompile(`^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})`)

// informersSynced reads a proxy's log and returns how long after start it logged that it
// had every Service and EndpointSlice.
func informersSynced(logPath, proxy string, start time.Time) (time.Duration, error) {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return 0, err
	}
	return syncedAfter(string(b), syncedMarkers[proxy], start)
}

// syncedAfter finds the first line holding each marker and returns the latest of their
// times, less start. klog's lines carry no year: start's is used.
func syncedAfter(log string, markers []string, start time.Time) (time.Duration, error) {
	var latest time.Time
	for _, marker := range markers {
		found := false
		for _, line := range strings.Split(log, "\n") {
			if !strings.Contains(line, marker) {
				continue
			}
			at, ok := klogTime(line, start)
			if !ok {
				continue
			}
			if at.After(latest) {
				latest = at
			}
			found = true
			break
		}
		if !found {
			return 0, fmt.Errorf("no %q in the proxy's log", marker)
		}
	}
	return latest.Sub(start), nil
}

// klogTime parses the time of a klog text line, in start's year and location.
func klogTime(line string, start time.Time) (time.Time, bool) {
	m := klogHeader.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, false
	}
	var f [6]int
	for i := range f {
		f[i], _ = strconv.Atoi(m[i+1])
	}
	return time.Date(start.Year(), time.Month(f[0]), f[1], f[2], f[3], f[4], f[5]*1000, start.Location()), true
}
