package order

import "context"

// PayGroup exposes payGroup to the tests.
func PayGroup(s *Store, ctx context.Context, ps []Payment) ([]bool, error) {
	return s.payGroup(ctx, ps, nil)
}

// Waiting is how many Pay calls wait for a committer to take them.
func Waiting(g *Grouper) int { return g.groups.Waiting() }

// WithoutSkipLocked has g behave as on a server without SKIP LOCKED.
func WithoutSkipLocked(g *Grouper) { g.noSkipLocked.Store(true) }

// PayGroupUncommitted runs payGroup with a group cut short just before
// its COMMIT.
func PayGroupUncommitted(s *Store, ctx context.Context, ps []Payment) ([]bool, error) {
	return s.payGroup(ctx, ps, func() bool { return false })
}
