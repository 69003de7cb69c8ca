// Package admin serves the dead-letter pages on the admin listener: a list
// with filters, counts by class and a chart of dead letters over time; each
// message with its body, reason, retries and history; replay and discard,
// of one row, of the selected rows or of a whole class, each with a reason
// and a dry run first. Operators sign in by name (admin.operators): the
// audit trail records who did what, and sessions expire and can be
// revoked. Without an operator configured the pages are off.
package admin

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"path"
	"slices"
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
	Store     *deadletter.Store
	Replayer  *replay.Replayer
	Operators []Operator
	Sessions  *Sessions
	Log       *zap.Logger
	// InsecureCookie leaves the Secure attribute off the session cookie
	// (admin.secureCookie false), for plain-HTTP use on a trusted host.
	// By default the cookie is Secure whatever the request arrived over:
	// behind a TLS-terminating ingress the request paysvc sees is plain
	// HTTP, yet the browser's is HTTPS, and a cookie without Secure would
	// also go out over any plain-HTTP request to the same host.
	InsecureCookie bool
}

const cookieName = "paysvc_admin"

type operatorKey struct{}

// sessionKey carries the key of the request's session ("" when a bearer
// token signed it in), found by auth.
type sessionKey struct{}

// operator is the signed-in operator of a request that passed auth.
func operator(r *http.Request) string { s, _ := r.Context().Value(operatorKey{}).(string); return s }

// Register adds the pages to mux. Every state-changing request must come
// from the page's own origin (the standard library's cross-origin
// protection, on Sec-Fetch-Site and Origin), besides the SameSite cookie.
func (s *Server) Register(mux *http.ServeMux) {
	cop := http.NewCrossOriginProtection()
	page := func(h http.HandlerFunc) http.Handler { return cop.Handler(s.auth(h)) }
	mux.HandleFunc("GET /login", s.loginPage)
	mux.Handle("POST /login", cop.Handler(http.HandlerFunc(s.login)))
	mux.Handle("POST /logout", page(s.logout))
	mux.Handle("GET /dlq", page(s.list))
	mux.Handle("POST /dlq/bulk", page(s.bulk))
	mux.Handle("GET /dlq/{id}", page(s.show))
	mux.Handle("POST /dlq/{id}/replay", page(s.replay))
	mux.Handle("POST /dlq/{id}/discard", page(s.discard))
	mux.Handle("GET /admin/sessions", page(s.sessions))
	mux.Handle("POST /admin/sessions/{id}/revoke", page(s.revoke))
}

// auth lets a request through with a live session of a configured
// operator (the cookie), or an operator's token (Authorization: Bearer,
// for scripts), and tells the handler who it is.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(s.Operators) == 0 {
			http.Error(w, "admin pages are off: set admin.operators (PAYSVC_ADMIN_OPERATORS_FILE)", http.StatusNotFound)
			return
		}
		name, session := "", ""
		if c, err := r.Cookie(cookieName); err == nil && s.Sessions != nil {
			op, id, err := s.Sessions.Lookup(r.Context(), c.Value, s.Operators) // only with the token it signed in with
			switch {
			case err == nil:
				name, session = op, id
			case !errors.Is(err, errNoSession):
				http.Error(w, "sessions: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		if bearer, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && name == "" {
			op, _ := identify(s.Operators, bearer)
			name = op.Name
		}
		if name == "" {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		ctx := context.WithValue(r.Context(), operatorKey{}, name)
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, sessionKey{}, session)))
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

// safeNext is where a sign-in may send the browser: a path of this site
// under /dlq, as the browser will read it, or /dlq. A prefix check alone
// let "/dlq/../\evil.example" through: http.Redirect cleans it to
// "/\evil.example", which browsers follow to another host.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		strings.ContainsRune(next, '\\') || !strings.HasPrefix(next, "/") {
		return "/dlq"
	}
	clean := path.Clean(u.Path)
	if clean != "/dlq" && !strings.HasPrefix(clean, "/dlq/") {
		return "/dlq"
	}
	if u.RawQuery != "" {
		return clean + "?" + u.RawQuery
	}
	return clean
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.FormValue("next"))
	op, ok := identify(s.Operators, r.FormValue("token"))
	name := op.Name
	if !ok || s.Sessions == nil {
		http.Redirect(w, r, "/login?error=unknown+token&next="+url.QueryEscape(next), http.StatusSeeOther)
		return
	}
	token, err := s.Sessions.Create(r.Context(), op)
	if err != nil {
		http.Error(w, "sessions: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.Log.Info("admin: signed in", zap.String("operator", name))
	http.SetCookie(w, s.cookie(token, int(s.Sessions.TTL.Seconds())))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// cookie is the session cookie holding token for maxAge seconds (-1:
// delete it). A browser lets only a Secure cookie replace a Secure one,
// so sign-out sets the same attributes.
func (s *Server) cookie(token string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: cookieName, Value: token, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: !s.InsecureCookie, MaxAge: maxAge}
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if id, _ := r.Context().Value(sessionKey{}).(string); id != "" {
		s.Sessions.Revoke(r.Context(), id, operator(r))
	}
	http.SetCookie(w, s.cookie("", -1))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// sessions lists the live sign-ins, each with a revoke button.
func (s *Server) sessions(w http.ResponseWriter, r *http.Request) {
	live, err := s.Sessions.Live(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.render(w, "sessions.html", map[string]any{"Sessions": live, "Operator": operator(r), "Msg": r.URL.Query().Get("msg")})
}

func (s *Server) revoke(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ok, err := s.Sessions.Revoke(r.Context(), id, operator(r))
	msg := "revoked"
	switch {
	case err != nil:
		msg = "revoke failed: " + err.Error()
	case !ok:
		msg = "no such live session"
	}
	s.Log.Info("admin: session revoked", zap.String("operator", operator(r)), zap.String("session", id[:min(12, len(id))]), zap.String("result", msg))
	http.Redirect(w, r, "/admin/sessions?msg="+url.QueryEscape(msg), http.StatusSeeOther)
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
	counts, err := s.Store.NewByClass(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	days, err := s.Store.PerDay(r.Context(), chartDays, time.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.render(w, "list.html", map[string]any{"Rows": rows, "OrderNo": f.OrderNo, "Class": f.Class, "Status": string(f.Status),
		"Since": q.Get("since"), "Problem": problem, "Counts": sortedCounts(counts), "Chart": newChart(days),
		"Operator": operator(r)})
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
	s.render(w, "show.html", map[string]any{"D": d, "Seen": seen(d), "Events": events, "Body": string(d.Body), "Siblings": siblings,
		"Prediction": s.Replayer.Predict(r.Context(), d), "Msg": r.URL.Query().Get("msg"), "Operator": operator(r)})
}

// seen is what a page showed of a dead letter, carried by its forms: its
// status and how many times it was parked ("NEW:2").
func seen(d deadletter.DeadLetter) string { return fmt.Sprintf("%s:%d", d.Status, d.ParkedCount) }

// asSeen is d as the operator's page showed it (seen's value): the store
// replays or discards it only if the row is still so once locked, never a
// row another operator discarded or replayed, or that failed again, since
// the page was read.
func asSeen(d deadletter.DeadLetter, value string) (deadletter.DeadLetter, bool) {
	st, n, ok := strings.Cut(value, ":")
	parked, err := strconv.Atoi(n)
	if !ok || err != nil || st == "" {
		return d, false
	}
	d.Status, d.ParkedCount = deadletter.Status(st), parked
	return d, true
}

// errUnseen: a form that does not say what its page showed.
const errUnseen = "the form does not say what the page showed (seen): reload the page and act on what it shows"

// target reads the row and the reason of a replay or discard, the row as
// the operator's page showed it; the operator is the one signed in, never
// a form field.
func (s *Server) target(w http.ResponseWriter, r *http.Request) (deadletter.DeadLetter, string, string, bool) {
	reason := strings.TrimSpace(r.FormValue("reason"))
	d, _, ok := s.get(w, r)
	if !ok {
		return d, "", "", false
	}
	if d, ok = asSeen(d, r.FormValue("seen")); !ok {
		s.back(w, r, d.ID, errUnseen)
		return d, "", "", false
	}
	if reason == "" {
		s.back(w, r, d.ID, "a reason is required")
		return d, "", "", false
	}
	return d, reason, operator(r), true
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
	if err := s.Store.MarkDiscarded(r.Context(), d, operator, reason); err != nil {
		msg = "discard failed: " + err.Error()
	}
	s.Log.Info("admin: discard", zap.Int64("dead_letter_id", d.ID), zap.String("operator", operator),
		zap.String("reason", reason), zap.String("result", msg))
	s.back(w, r, d.ID, msg)
}

// chartDays is how many days the list page's chart shows.
const chartDays = 14

type classCount struct {
	Class string
	N     int
}

func sortedCounts(m map[string]int) []classCount {
	var out []classCount
	for c, n := range m {
		out = append(out, classCount{c, n})
	}
	slices.SortFunc(out, func(a, b classCount) int { return cmp.Or(cmp.Compare(b.N, a.N), strings.Compare(a.Class, b.Class)) })
	return out
}

// chart is the list page's bar chart of dead letters per day, drawn as
// inline SVG by the template (no script: the page's CSP allows none).
type chart struct {
	Bars   []bar
	Max    int
	Width  int
	Height int
}

type bar struct {
	Day        string
	N          int
	X, Y, W, H int
}

func newChart(days []deadletter.DayCount) chart {
	c := chart{Width: 28 * len(days), Height: 80}
	for _, d := range days {
		c.Max = max(c.Max, d.N)
	}
	for i, d := range days {
		h := 0
		if c.Max > 0 {
			h = d.N * (c.Height - 12) / c.Max
		}
		c.Bars = append(c.Bars, bar{Day: d.Day.Format("01-02"), N: d.N, X: i*28 + 2, Y: c.Height - 12 - h, W: 24, H: h})
	}
	return c
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
