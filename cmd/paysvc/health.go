package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/metrics"
)

const (
	// healthHeaderTimeout bounds the reading of a request's headers: a
	// client that trickles them does not hold a connection.
	healthHeaderTimeout = 5 * time.Second
	// healthShutdown is how long requests under way may finish at
	// shutdown.
	healthShutdown = 5 * time.Second
)

// healthServer is the daemon's HTTP listener: /healthz, /readyz and
// /metrics from the start, the admin pages once the daemon is wired.
type healthServer struct {
	mux      *http.ServeMux
	srv      *http.Server
	starting atomic.Pointer[string]            // what start-up waits for
	consumer atomic.Pointer[listener.Consumer] // nil until wired
	monitor  atomic.Pointer[listener.Monitor]
}

// startHealth binds addr (an error names http.addr) and serves /healthz,
// /readyz and /metrics.
func startHealth(addr string, m *metrics.Metrics, log *zap.Logger) (*healthServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http.addr %s: %w", addr, err)
	}
	h := &healthServer{mux: http.NewServeMux()}
	h.stage("starting")
	// Liveness: the process answers. Nothing a dependency does changes it.
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	h.mux.HandleFunc("GET /readyz", h.readyz)
	h.mux.Handle("GET /metrics", m.Handler())
	// net/http's own lines (a handler's panic, an accept error) go to the
	// log as JSON, not to stderr in plain text.
	errorLog, err := zap.NewStdLogAt(log.With(zap.String("lib", "net/http")), zap.ErrorLevel)
	if err != nil {
		ln.Close()
		return nil, err
	}
	h.srv = &http.Server{Handler: h.mux, ReadHeaderTimeout: healthHeaderTimeout, ErrorLog: errorLog}
	go func() {
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin http server", zap.Error(err))
		}
	}()
	return h, nil
}

// stage records what start-up waits for, for /readyz. A nil h ignores it.
func (h *healthServer) stage(s string) {
	if h != nil {
		h.starting.Store(&s)
	}
}

// serve adds the admin pages and makes /readyz follow the consumer.
func (h *healthServer) serve(c *listener.Consumer, m *listener.Monitor, a *admin.Server) {
	a.Register(h.mux)
	h.monitor.Store(m)
	h.consumer.Store(c)
}

func (h *healthServer) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	c, m := h.consumer.Load(), h.monitor.Load()
	if c == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not consuming: %s\n", *h.starting.Load())
		return
	}
	where := fmt.Sprintf("broker node: %s\nredis server: %s\n", cmp.Or(c.Node(), "-"), cmp.Or(m.RedisServer(), "-"))
	if !c.Ready() {
		w.WriteHeader(http.StatusServiceUnavailable)
		if why := c.PauseReason(); why != "" {
			fmt.Fprintf(w, "not consuming: paused: %s\n%s", why, where)
			return
		}
		io.WriteString(w, "not consuming (reconnecting, or paused on a dependency)\n"+where)
		return
	}
	io.WriteString(w, "ready\n"+where)
}

// shutdown stops the listener, giving requests under way healthShutdown.
func (h *healthServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), healthShutdown)
	defer cancel()
	h.srv.Shutdown(ctx)
}
