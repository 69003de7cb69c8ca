package order

// PayGroup exposes payGroup to the tests.
var PayGroup = (*Store).payGroup

// Waiting is how many Pay calls wait for a committer to take them.
func Waiting(g *Grouper) int { return g.groups.Waiting() }
