package sqldb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// The connection dies before COMMIT reaches the server: InTx must report the
// outcome as unknown, never as success.
func TestInTxReportsCommitUnknown(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00)")
	err := sqldb.InTx(context.Background(), db, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(context.Background(), "UPDATE t_account SET balance = 5.00 WHERE user_id = 1"); err != nil {
			return err
		}
		var id int64
		if err := tx.GetContext(context.Background(), &id, "SELECT CONNECTION_ID()"); err != nil {
			return err
		}
		if _, err := db.Exec("KILL CONNECTION ?", id); err != nil {
			return err
		}
		testenv.Eventually(t, 5*time.Second, func() bool {
			var n int
			db.Get(&n, "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?", id)
			return n == 0
		}, "connection %d not killed", id)
		return nil
	})
	if !errors.Is(err, sqldb.ErrCommitUnknown) {
		t.Fatalf("InTx = %v, want ErrCommitUnknown", err)
	}
	var bal string
	db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
	if bal != "10.00" {
		t.Fatalf("balance %s: the killed transaction was applied", bal)
	}
}

func TestInTxRollsBackOnError(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00)")
	boom := errors.New("boom")
	err := sqldb.InTx(context.Background(), db, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(context.Background(), "UPDATE t_account SET balance = 5.00 WHERE user_id = 1"); err != nil {
			return err
		}
		return boom
	})
	var bal string
	db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
	if !errors.Is(err, boom) || bal != "10.00" {
		t.Fatalf("InTx = %v, balance %s; want boom and 10.00", err, bal)
	}
}
