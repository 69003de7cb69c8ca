package admin

import (
	"net/http"
	"strings"
	"testing"

	"github.com/paysvc/paysvc/internal/deadletter"
)

// A bulk confirmation acts on each row as its dry run showed it, and is
// refused whole when a row comes without what its dry run showed.
func TestRowsAsShown(t *testing.T) {
	now := []deadletter.DeadLetter{
		{ID: 7, Status: deadletter.Discarded, ParkedCount: 1},
		{ID: 9, Status: deadletter.New, ParkedCount: 3},
	}
	got, err := rowsAsShown(now, []string{"9:NEW:2", "7:NEW:1", "junk"})
	if err != nil {
		t.Fatal(err.msg)
	}
	if got[0].ID != 7 || got[0].Status != deadletter.New || got[0].ParkedCount != 1 ||
		got[1].ID != 9 || got[1].Status != deadletter.New || got[1].ParkedCount != 2 {
		t.Fatalf("rows as shown: %+v", got)
	}
	if now[0].Status != deadletter.Discarded {
		t.Fatal("the rows as they are now were changed")
	}
	_, err = rowsAsShown(now, []string{"7:NEW:1"})
	if err == nil || err.code != http.StatusBadRequest || !strings.Contains(err.msg, "dead letter 9: ") {
		t.Fatalf("a row without its seen value: %+v", err)
	}
}
