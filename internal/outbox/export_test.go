package outbox

// Marks is how many UPDATE statements marked notices sent.
func (d *Dispatcher) Marks() int { return d.marks }
