package metrics

import (
	"flag"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.txt from New()")

// The metrics paysvc exports are a contract with the alert rules, the
// dashboards and whoever scrapes them: every name, help text, type, label
// set and histogram bucket, and the series present from the start, are
// those listed in testdata/metrics.txt (go test -run TestMetricsContract
// -args -update rewrites it after a deliberate change).
func TestMetricsContract(t *testing.T) {
	m := New()
	var lines []string
	for _, c := range m.own {
		ch := make(chan *prometheus.Desc, 4)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			lines = append(lines, "desc "+d.String())
		}
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "paysvc_") {
			continue
		}
		lines = append(lines, "type "+f.GetName()+" "+f.GetType().String())
		for _, s := range f.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			lines = append(lines, "series "+f.GetName()+"{"+strings.Join(labels, ",")+"}")
			if h := s.GetHistogram(); h != nil {
				var bounds []string
				for _, b := range h.GetBucket() {
					bounds = append(bounds, strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
				}
				lines = append(lines, "buckets "+f.GetName()+" "+strings.Join(bounds, ","))
			}
		}
	}
	sort.Strings(lines)
	got := strings.Join(lines, "\n") + "\n"
	if *update {
		if err := os.WriteFile("testdata/metrics.txt", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gotSet := map[string]bool{}
		for _, l := range lines {
			gotSet[l] = true
		}
		wantSet := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSuffix(string(want), "\n"), "\n") {
			wantSet[l] = true
			if !gotSet[l] {
				t.Errorf("missing: %s", l)
			}
		}
		for _, l := range lines {
			if !wantSet[l] {
				t.Errorf("not in testdata/metrics.txt: %s", l)
			}
		}
		if !t.Failed() {
			t.Error("the metrics differ from testdata/metrics.txt in order or repetition")
		}
	}
}
