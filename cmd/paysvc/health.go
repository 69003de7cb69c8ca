package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"sync"
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

// healthServer is the daemon's HTTP listeners: on http.addr /healthz,
// /readyz and /metrics from the start; the operator pages (/login, /dlq,
// /admin/sessions) once the daemon is wired, on http.addr too unless
// admin.addr gives them a listener of their own. Split, a NetworkPolicy
// can let the monitoring namespace scrape http.addr without opening the
// pages to it.
type healthServer struct {
	mux      *http.ServeMux                    // http.addr's
	srv      *http.Server                      // nil: http.addr empty
	adminMux *http.ServeMux                    // the pages': mux itself unless admin.addr is set
	admin    *http.Server                      // admin.addr's; nil when unset
	wired    atomic.Bool                       // the pages are registered
	starting atomic.Pointer[string]            // what start-up waits for
	consumer atomic.Pointer[listener.Consumer] // nil until wired
	monitor  atomic.Pointer[listener.Monitor]
}

// startHealth binds httpAddr and adminAddr (an error names http.addr or
// admin.addr), each unless empty, and serves /healthz, /readyz and
// /metrics on httpAddr. Both empty: nil, nothing served.
func startHealth(httpAddr, adminAddr string, m *metrics.Metrics, log *zap.Logger) (*healthServer, error) {
	if httpAddr == "" && adminAddr == "" {
		return nil, nil
	}
	// net/http's own lines (a handler's panic, an accept error) go to the
	// log as JSON, not to stderr in plain text.
	errorLog, err := zap.NewStdLogAt(log.With(zap.String("lib", "net/http")), zap.ErrorLevel)
	if err != nil {
		return nil, err
	}
	h := &healthServer{mux: http.NewServeMux()}
	h.adminMux = h.mux
	h.stage("starting")
	// Liveness: the process answers. Nothing a dependency does changes it.
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	h.mux.HandleFunc("GET /readyz", h.readyz)
	h.mux.Handle("GET /metrics", m.Handler())
	if httpAddr != "" {
		if h.srv, err = listenHTTP("http.addr", httpAddr, h.mux, errorLog, log); err != nil {
			return nil, err
		}
	}
	if adminAddr != "" {
		h.adminMux = http.NewServeMux()
		// Before the pages are wired: a 503 that says so, not a 404.
		h.adminMux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if !h.wired.Load() {
				http.Error(w, "admin pages: not yet started: "+*h.starting.Load(), http.StatusServiceUnavailable)
				return
			}
			http.NotFound(w, r)
		})
		if h.admin, err = listenHTTP("admin.addr", adminAddr, h.adminMux, errorLog, log); err != nil {
			h.shutdown()
			return nil, err
		}
	}
	return h, nil
}

// listenHTTP binds addr (an error names key) and serves handler on it.
func listenHTTP(key, addr string, handler http.Handler, errorLog *stdlog.Logger, log *zap.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", key, addr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: healthHeaderTimeout, ErrorLog: errorLog}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", zap.String("listener", key), zap.Error(err))
		}
	}()
	return srv, nil
}

// stage records what start-up waits for, for /readyz. A nil h ignores it.
func (h *healthServer) stage(s string) {
	if h != nil {
		h.starting.Store(&s)
	}
}

// serve adds the admin pages (on admin.addr when set, else http.addr) and
// makes /readyz follow the consumer.
func (h *healthServer) serve(c *listener.Consumer, m *listener.Monitor, a *admin.Server) {
	a.Register(h.adminMux)
	h.wired.Store(true)
	h.monitor.Store(m)
	h.consumer.Store(c)
}

// readyz answers from the state the consumer and the monitor keep (their
// dependency checks), never by asking MySQL, Redis or RabbitMQ: within the
// kubelet's probe timeout (1 s by default) however slow a dependency is
// (TestReadyzAnswersFastWhileMySQLIsSlow).
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

// shutdown stops the listeners together, giving requests under way
// healthShutdown.
func (h *healthServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), healthShutdown)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range []*http.Server{h.srv, h.admin} {
		if srv != nil {
			wg.Go(func() { srv.Shutdown(ctx) })
		}
	}
	wg.Wait()
}
