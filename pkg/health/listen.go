package health

import (
	"context"
	"net"
	"net/http"
	"time"
)

// listenFunc opens a listening socket. It is the seam that lets tests choose the real
// address (a loopback port 0) or inject a bind failure; production uses listenTCP.
type listenFunc func(ctx context.Context, network, addr string) (net.Listener, error)

// listenTCP is the production listenFunc.
func listenTCP(ctx context.Context, network, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, network, addr)
}

// readHeaderTimeout bounds how long a client may take to send its request headers, so
// that a stuck prober cannot pin a goroutine and a connection forever.
const readHeaderTimeout = 10 * time.Second

func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}
}

// setJSONHeaders sets the headers every health response carries.
func setJSONHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}
