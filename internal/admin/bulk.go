package admin

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/deadletter"
)

// maxBulk bounds one bulk action.
const maxBulk = 1000

// bulkLine is one row of the bulk page: what would become of a dead letter
// (the dry run), or what did.
type bulkLine struct {
	ID      int64
	OrderNo string
	Class   string
	Outcome string
}

// bulk replays or discards the selected rows (ids) or every NEW row of a
// class. Without confirm it changes nothing and shows what would happen to
// each row (the dry run), with a form to confirm the same selection.
func (s *Server) bulk(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	action, class, reason := r.FormValue("action"), strings.TrimSpace(r.FormValue("class")), strings.TrimSpace(r.FormValue("reason"))
	if action != "replay" && action != "discard" {
		http.Error(w, "action: want replay or discard", http.StatusBadRequest)
		return
	}
	confirm := r.FormValue("confirm") != ""
	rows, skipped, err := s.bulkSelection(r, class, confirm)
	if err != nil {
		http.Error(w, err.msg, err.code)
		return
	}
	var ids, seenRows []string
	for _, d := range rows {
		ids = append(ids, strconv.FormatInt(d.ID, 10))
		seenRows = append(seenRows, strconv.FormatInt(d.ID, 10)+":"+seen(d))
	}
	data := map[string]any{"Action": action, "Class": class, "IDs": ids, "Seen": seenRows, "Reason": reason, "Operator": operator(r),
		"Skipped": skipped}
	if len(rows) == 0 || !confirm || reason == "" {
		data["Lines"], data["DryRun"] = s.bulkDryRun(r.Context(), action, rows), true
		if confirm && reason == "" {
			data["Problem"] = "a reason is required"
		}
		s.render(w, "bulk.html", data)
		return
	}
	if rows, err = rowsAsShown(rows, r.Form["seen"]); err != nil {
		http.Error(w, err.msg, err.code)
		return
	}
	op := operator(r)
	lines, problem := s.bulkAct(r.Context(), action, rows, op, reason)
	if problem != "" {
		data["Problem"] = problem
	}
	s.Log.Info("admin: bulk "+action, zap.String("operator", op), zap.String("reason", reason),
		zap.String("error_class", class), zap.Strings("dead_letter_ids", ids))
	data["Lines"] = lines
	s.render(w, "bulk.html", data)
}

// bulkError is a bulk request refused, with its HTTP status.
type bulkError struct {
	code int
	msg  string
}

// bulkSelection reads the rows a bulk request is about. A class selects
// its NEW rows for the dry run; the confirmation names the rows the dry
// run showed, so rows parked since are not swept in. Rows ticked on the
// list (NEW when it was shown) that are not NEW any more (another operator
// discarded or replayed them since) are left out of a dry run, and skipped
// says so: a bulk action is for NEW rows, and a discarded one is replayed
// only on its own page, by intent. A confirmation keeps every row it
// names: rowsAsShown checks them against what its dry run showed.
func (s *Server) bulkSelection(r *http.Request, class string, confirm bool) (rows []deadletter.DeadLetter, skipped []string, _ *bulkError) {
	if class != "" && len(r.Form["id"]) == 0 {
		rows, err := s.Store.List(r.Context(), deadletter.Filter{Class: class, Status: deadletter.New, Limit: maxBulk})
		if err != nil {
			return nil, nil, &bulkError{http.StatusInternalServerError, err.Error()}
		}
		return rows, nil, nil
	}
	for _, v := range r.Form["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, nil, &bulkError{http.StatusBadRequest, "id: want numbers"}
		}
		d, _, err := s.Store.Get(r.Context(), id)
		if err != nil {
			return nil, nil, &bulkError{http.StatusNotFound, fmt.Sprintf("dead letter %d: %v", id, err)}
		}
		if d.Status != deadletter.New && !confirm {
			skipped = append(skipped, fmt.Sprintf("dead letter %d (%s) is %s now: left out", d.ID, d.Order(), d.Status))
			continue
		}
		rows = append(rows, d)
	}
	return rows, skipped, nil
}

// bulkDryRun says what the action would do to each row, changing nothing.
func (s *Server) bulkDryRun(ctx context.Context, action string, rows []deadletter.DeadLetter) []bulkLine {
	var lines []bulkLine
	for _, d := range rows {
		what := "would be discarded"
		if action == "replay" {
			what = s.Replayer.Predict(ctx, d)
		}
		lines = append(lines, bulkLine{d.ID, d.Order(), d.ErrorClass, what})
	}
	return lines
}

// rowsAsShown is the rows as the dry run showed them (its form's seen
// values, "ID:STATUS:PARKED" each), not as they are now: the store acts on
// a row only if it is still so once locked. A row without its seen value
// refuses the request.
func rowsAsShown(rows []deadletter.DeadLetter, seenValues []string) ([]deadletter.DeadLetter, *bulkError) {
	shown := map[string]string{}
	for _, v := range seenValues {
		if id, rest, ok := strings.Cut(v, ":"); ok {
			shown[id] = rest
		}
	}
	out := make([]deadletter.DeadLetter, len(rows))
	for i, d := range rows {
		var ok bool
		if out[i], ok = asSeen(d, shown[strconv.FormatInt(d.ID, 10)]); !ok {
			return nil, &bulkError{http.StatusBadRequest, fmt.Sprintf("dead letter %d: %s", d.ID, errUnseen)}
		}
	}
	return out, nil
}

// bulkAct replays or discards the rows as op, and returns each row's
// outcome; problem is set when the replay as a whole failed.
func (s *Server) bulkAct(ctx context.Context, action string, rows []deadletter.DeadLetter, op, reason string) (lines []bulkLine, problem string) {
	if action == "replay" {
		res, err := s.Replayer.Replay(ctx, rows, op, reason, false)
		if err != nil {
			problem = "replay failed: " + err.Error()
		}
		for i, x := range res {
			outcome := x.Outcome
			if x.Err != nil {
				outcome = "failed: " + x.Err.Error()
			}
			lines = append(lines, bulkLine{x.ID, x.OrderNo, rows[i].ErrorClass, outcome})
		}
		return lines, problem
	}
	for _, d := range rows {
		outcome := "discarded"
		if err := s.Store.MarkDiscarded(ctx, d, op, reason); err != nil {
			outcome = "failed: " + err.Error()
		}
		lines = append(lines, bulkLine{d.ID, d.Order(), d.ErrorClass, outcome})
	}
	return lines, problem
}
