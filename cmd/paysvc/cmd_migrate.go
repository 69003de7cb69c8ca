package main

import (
	"context"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// migrateCommands: the schema.
var migrateCommands = []*cmdSpec{{
	name:    "migrate",
	summary: "apply the embedded schema migrations (safe to re-run)",
	details: "Creates the database if it is missing. Logs go to stdout, as run's.",
	flags:   noFlags(func(ctx context.Context, c *cmdLine) error { return c.daemon(ctx, migrate) }),
}}

// migrate creates the database if it is missing, then applies migrations.
func migrate(ctx context.Context, cfg *Config, log *zap.Logger) error {
	dsn, err := cfg.mysqlDSN()
	if err != nil {
		return err
	}
	if err := sqldb.CreateDatabase(ctx, dsn); err != nil {
		return err
	}
	db, err := sqldb.OpenWith(ctx, dsn, sqldb.Options{MaxOpen: 2, Log: log})
	if err != nil {
		return err
	}
	defer db.Close()
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		return err
	}
	applied, err := sqldb.Migrate(ctx, db, ms)
	for _, name := range applied {
		log.Info("migration applied", zap.String("migration", name))
	}
	if err != nil {
		return err
	}
	log.Info("schema up to date", zap.Int("applied", len(applied)), zap.Int("migrations", len(ms)))
	return nil
}
