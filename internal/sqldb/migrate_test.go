package sqldb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/migrations"
)

func TestStatementsAndVersions(t *testing.T) {
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.Version != i+1 {
			t.Fatalf("migration %d is %s: versions must run 1, 2, 3 ...", i, m.Name)
		}
	}
}

// A t_account_flow from before paysvc, without the unique index: migrate adds
// the index, or refuses naming reconcile when duplicates exist.
func TestLegacyFlowTableGetsUniqueIndexOrRefuses(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t) // fully migrated
	ctx := context.Background()
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	db.MustExec("DELETE FROM schema_migrations WHERE version = 3")
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES
		(1, -5.00, 'LEG1', 'PAY_DEDUCT'), (1, -5.00, 'LEG1', 'PAY_DEDUCT'), (1, -3.00, 'LEG2', 'PAY_DEDUCT')`)
	if err := sqldb.CheckSchema(ctx, db, ms); err == nil {
		t.Fatal("CheckSchema accepted a flow table without the unique index")
	}
	_, err = sqldb.Migrate(ctx, db, ms)
	if err == nil || !strings.Contains(err.Error(), "paysvc reconcile") || !strings.Contains(err.Error(), "1 (biz_no, type) pairs") {
		t.Fatalf("migrate with duplicates: %v, want a refusal pointing to reconcile", err)
	}
	// Once the duplicate is gone the index is added.
	db.MustExec("DELETE FROM t_account_flow WHERE biz_no = 'LEG1' ORDER BY id DESC LIMIT 1")
	if _, err := sqldb.Migrate(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
	if err := sqldb.CheckSchema(ctx, db, ms); err != nil {
		t.Fatal(err)
	}
}
