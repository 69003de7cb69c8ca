package main

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"
)

// pairs answers "does this setting change the latency at half the peak?"
// where single runs cannot: on this machine the same open loop gives p99s
// from 20 to 150 ms minutes apart. Each round drains o.n payments with the
// daemon on the compare phase's settings (its peak), then runs two open
// loops at half that peak back to back, one on those settings (A) and one
// with pairEnv added (B), in alternating order; it prints each pair and how
// many B won; B may also be another binary (-pair-paysvc), to weigh a code
// change. Only pairs run close together compare.
func pairs(ctx context.Context, o *options, rounds int, pairEnv []string, pairBinary string) error {
	if len(pairEnv) == 0 && pairBinary == "" {
		return fmt.Errorf("pairs: name B's settings with -pair-env, or its binary with -pair-paysvc")
	}
	a, binA := o.paysvcEnv, o.paysvcBinary
	b, binB := append(append([]string(nil), a...), pairEnv...), cmp.Or(pairBinary, binA)
	defer func() { o.paysvcEnv, o.paysvcBinary = a, binA }()
	var wins int
	var p99a, p99b []string
	for i := 1; i <= rounds; i++ {
		o.paysvcEnv, o.paysvcBinary = a, binA // the peak is A's
		peak, err := measureDaemon(ctx, o, o.n, 0, a...)
		if err != nil {
			return err
		}
		rate := peak.rate / 2
		var la, lb latencies
		sides := []struct {
			env []string
			bin string
			lat *latencies
		}{{a, binA, &la}, {b, binB, &lb}}
		if i%2 == 0 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, s := range sides {
			o.paysvcEnv, o.paysvcBinary = s.env, s.bin
			if *s.lat, err = openLoop(ctx, o, rate, 10*time.Second, true); err != nil {
				return err
			}
		}
		if lb.p99 < la.p99 {
			wins++
		}
		p99a, p99b = append(p99a, ms(la.p99)), append(p99b, ms(lb.p99))
		fmt.Printf("pair %d at %.0f msg/s: A p50 %s p99 %s | B p50 %s p99 %s\n", i, rate, ms(la.p50), ms(la.p99), ms(lb.p50), ms(lb.p99))
	}
	fmt.Printf("pairs: A (%s, %s) p99 %s\n       B (%s, %s) p99 %s\n       B lower in %d of %d pairs\n",
		binA, settingsOf(a), strings.Join(p99a, ", "), binB, settingsOf(b), strings.Join(p99b, ", "), wins, rounds)
	return nil
}

func settingsOf(env []string) string {
	if len(env) == 0 {
		return "defaults"
	}
	return strings.Join(env, " ")
}
