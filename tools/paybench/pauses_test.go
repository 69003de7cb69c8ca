package main

import (
	"strings"
	"testing"
)

// A pause in which nothing was paid while payments waited, with no write
// completing and I/O in flight, is counted as the disk's; the same gap
// with writes completing is a pause, not the disk's; a gap in which
// nothing was waiting (a slow publisher) is no pause.
func TestPausesTellTheDiskFromTheRest(t *testing.T) {
	// One payment every 1 ms from 0 to 300 ms; those published in
	// [100, 200) are paid at 200 (a 100 ms pause), the others 1 ms later.
	var sent, lat, paid []float64
	for ms := 0.0; ms < 300; ms++ {
		l := 1.0
		if ms >= 99 && ms < 200 {
			l = 200 - ms
		}
		sent, lat, paid = append(sent, ms), append(lat, l), append(paid, ms+l)
	}
	host := func(stalled bool) []hostSample {
		var h []hostSample
		var writes int64
		for ms := 0.0; ms <= 300; ms += 10 {
			s := hostSample{ms: ms, writes: writes, inFlight: 1} // a busy disk
			if stalled && ms > 100 && ms < 200 {
				s.inFlight = 2
			} else {
				writes += 40
				s.writes = writes
			}
			h = append(h, s)
		}
		return h
	}
	got := pauses(paid, sent, lat, host(true))
	if !strings.Contains(got, "nothing paid: 1 (") || !strings.Contains(got, "1 with the disk stalled") {
		t.Fatalf("a stalled disk under a pause: %q", got)
	}
	if !strings.Contains(got, "51 of 51 payments over 50ms waited through one") {
		t.Fatalf("the slow payments: %q", got)
	}
	if got := pauses(paid, sent, lat, host(false)); !strings.Contains(got, "nothing paid: 1 (") || !strings.Contains(got, "0 with the disk stalled") {
		t.Fatalf("a pause with writes completing: %q", got)
	}
	// Ten payments a second, each paid in 1 ms: gaps of 99 ms, nothing waiting.
	sent, lat, paid = nil, nil, nil
	for ms := 0.0; ms < 1000; ms += 100 {
		sent, lat, paid = append(sent, ms), append(lat, 1), append(paid, ms+1)
	}
	if got := pauses(paid, sent, lat, host(true)); !strings.HasPrefix(got, "pauses of 50ms+ with nothing paid: 0 (") {
		t.Fatalf("a slow publisher's gaps counted as pauses: %q", got)
	}
}
