// Package admin serves the dead-letter pages on the admin listener: a list
// with filters, each message with its body, reason, retries and history, and
// replay and discard buttons that ask for a reason. Every page needs the
// admin token (admin.token, from the environment); without one configured
// the pages are off.
package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/replay"
)

//go:embed templates/*.html
var templateFS embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"ts":       func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 MST") },
	"statuses": func() []string { return []string{"NEW", "REPLAYED", "DISCARDED"} },
	"short": func(s string) string {
		if len(s) > 120 {
			return s[:120] + "…"
		}
		return s
	},
}).ParseFS(templateFS, "templates/*.html"))

// Server holds what the pages need.
type Server struct {
	Store    *deadletter.Store
	Replayer *replay.Replayer
	Token    string
	Log      *zap.Logger
}

const cookieName = "paysvc_admin"

// Register adds the pages to mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.logout)
	mux.Handle("GET /dlq", s.auth(http.HandlerFunc(s.list)))
	mux.Handle("GET /dlq/{id}", s.auth(http.HandlerFunc(s.show)))
	mux.Handle("POST /dlq/{id}/replay", s.auth(http.HandlerFunc(s.replay)))
	mux.Handle("POST /dlq/{id}/discard", s.auth(http.HandlerFunc(s.discard)))
}

func (s *Server) session() string {
	sum := sha256.Sum256([]byte("paysvc-admin-session:" + s.Token))
	return hex.EncodeToString(sum[:])
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// auth lets a request through with the session cookie or a bearer token.
// Forms must come from this origin: the cookie is SameSite=Strict and a
// foreign Origin header is refused.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.Token == "" {
			http.Error(w, "admin pages are off: set admin.token (PAYSVC_ADMIN_TOKEN)", http.StatusNotFound)
			return
		}
		ok := false
		if c, err := r.Cookie(cookieName); err == nil {
			ok = equal(c.Value, s.session())
		}
		if bearer, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found {
			ok = ok || equal(bearer, s.Token)
		}
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			if o := r.Header.Get("Origin"); o != "" && o != "null" && o != "http://"+r.Host && o != "https://"+r.Host {
				http.Error(w, "cross-origin request refused", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	w.Header().Set("X-Frame-Options", "DENY")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		s.Log.Error("admin: render", zap.String("page", name), zap.Error(err))
	}
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, "login.html", map[string]any{"Next": safeNext(r.URL.Query().Get("next")), "Error": r.URL.Query().Get("error")})
}

func safeNext(next string) string {
	if !strings.HasPrefix(next, "/dlq") {
		return "/dlq"
	}
	return next
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.FormValue("next"))
	if s.Token == "" || !equal(r.FormValue("token"), s.Token) {
		http.Redirect(w, r, "/login?error=wrong+token&next="+url.QueryEscape(next), http.StatusSeeOther)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.session(), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: 12 * 3600})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := deadletter.Filter{OrderNo: q.Get("order"), Class: q.Get("class"), Status: deadletter.Status(q.Get("status")), Limit: 500}
	var problem string
	if since := q.Get("since"); since != "" {
		t, err := ParseSince(since, time.Now())
		if err != nil {
			problem = err.Error()
		}
		f.Since = t
	}
	rows, err := s.Store.List(r.Context(), f)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.render(w, "list.html", map[string]any{"Rows": rows, "OrderNo": f.OrderNo, "Class": f.Class, "Status": string(f.Status),
		"Since": q.Get("since"), "Problem": problem})
}

// get reads the dead letter the path names by id; it answers the request
// itself when it cannot.
func (s *Server) get(w http.ResponseWriter, r *http.Request) (deadletter.DeadLetter, []deadletter.Event, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return deadletter.DeadLetter{}, nil, false
	}
	d, events, err := s.Store.Get(r.Context(), id)
	switch {
	case errors.Is(err, deadletter.ErrNotFound):
		http.NotFound(w, r)
		return d, nil, false
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return d, nil, false
	}
	return d, events, true
}

func (s *Server) show(w http.ResponseWriter, r *http.Request) {
	d, events, ok := s.get(w, r)
	if !ok {
		return
	}
	var siblings []deadletter.DeadLetter
	if d.Order() != "" {
		rows, err := s.Store.ByOrder(r.Context(), d.Order())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		for _, o := range rows {
			if o.ID != d.ID {
				siblings = append(siblings, o)
			}
		}
	}
	s.render(w, "show.html", map[string]any{"D": d, "Events": events, "Body": string(d.Body), "Siblings": siblings,
		"Prediction": s.Replayer.Predict(r.Context(), d), "Msg": r.URL.Query().Get("msg")})
}

func (s *Server) target(w http.ResponseWriter, r *http.Request) (deadletter.DeadLetter, string, string, bool) {
	reason, operator := strings.TrimSpace(r.FormValue("reason")), strings.TrimSpace(r.FormValue("operator"))
	if operator == "" {
		operator = "web"
	}
	d, _, ok := s.get(w, r)
	if !ok {
		return d, "", "", false
	}
	if reason == "" {
		s.back(w, r, d.ID, "a reason is required")
		return d, "", "", false
	}
	return d, reason, operator, true
}

func (s *Server) back(w http.ResponseWriter, r *http.Request, id int64, msg string) {
	http.Redirect(w, r, "/dlq/"+strconv.FormatInt(id, 10)+"?msg="+url.QueryEscape(msg), http.StatusSeeOther)
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request) {
	d, reason, operator, ok := s.target(w, r)
	if !ok {
		return
	}
	res, err := s.Replayer.Replay(r.Context(), []deadletter.DeadLetter{d}, operator, reason, false)
	msg := ""
	switch {
	case err != nil:
		msg = "replay failed: " + err.Error()
	case res[0].Err != nil:
		msg = "replay failed: " + res[0].Err.Error()
	default:
		msg = res[0].Outcome
	}
	s.Log.Info("admin: replay", zap.Int64("dead_letter_id", d.ID), zap.String("operator", operator),
		zap.String("reason", reason), zap.String("result", msg))
	s.back(w, r, d.ID, msg)
}

func (s *Server) discard(w http.ResponseWriter, r *http.Request) {
	d, reason, operator, ok := s.target(w, r)
	if !ok {
		return
	}
	msg := "discarded"
	if err := s.Store.MarkDiscarded(r.Context(), d.ID, operator, reason); err != nil {
		msg = "discard failed: " + err.Error()
	}
	s.Log.Info("admin: discard", zap.Int64("dead_letter_id", d.ID), zap.String("operator", operator),
		zap.String("reason", reason), zap.String("result", msg))
	s.back(w, r, d.ID, msg)
}

// ParseSince reads an RFC 3339 time, a date, or a duration back from now
// ("24h").
func ParseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("since: want a time (2026-11-30T08:00:00Z), a date, or a duration such as 24h")
}
