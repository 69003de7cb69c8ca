package timeline

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/paysvc/paysvc/internal/testenv"
)

// Events recorded at once, through shared INSERTs or alone, are each stored
// once with their own fields, stamped with the instance.
func TestRecorderStoresEveryEvent(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			t.Parallel()
			_, db := testenv.MySQL(t)
			r := &Recorder{DB: db, Instance: "host/1"}
			if shared {
				defer r.Start(1, 8)()
			}
			const n = 40
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					e := Event{OrderNo: fmt.Sprintf("T%02d", i), Event: "DUPLICATE", Attempt: i, Detail: strings.Repeat("x", 2000)}
					if err := r.Record(context.Background(), e); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			var rows []struct {
				OrderNo  string `db:"order_no"`
				Attempt  int    `db:"attempt"`
				Detail   string `db:"detail"`
				Instance string `db:"instance"`
			}
			if err := db.Select(&rows, "SELECT order_no, attempt, detail, instance FROM t_payment_event ORDER BY order_no"); err != nil {
				t.Fatal(err)
			}
			if len(rows) != n {
				t.Fatalf("%d events stored, want %d", len(rows), n)
			}
			for i, row := range rows {
				if row.OrderNo != fmt.Sprintf("T%02d", i) || row.Attempt != i || len(row.Detail) != 1024 || row.Instance != "host/1" {
					t.Errorf("event %d stored as %+v", i, row)
				}
			}
		})
	}
}
