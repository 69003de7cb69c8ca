package order

// PayGroup exposes payGroup to the tests.
var PayGroup = (*Store).payGroup

// Waiting is how many Pay calls g has not answered yet.
func Waiting(g *Grouper) int { return int(g.waiting.Load()) }
