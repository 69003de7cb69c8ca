package outbox

// Marks is how many UPDATE statements marked notices sent.
func (d *Dispatcher) Marks() int { return d.marks }

// Batches is how many publish batches took handed-over notices.
func (d *Dispatcher) Batches() int { return int(d.batches.Load()) }
