package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/paysvc/paysvc/internal/metrics"
)

// The Grafana dashboard is valid JSON with the panels an on-call person
// opens first, and every query names only metrics paysvc exports. One
// Prometheus may watch several deployments: the dashboard has namespace
// and job variables, and every metric a panel queries is selected by both
// (a query without them would add staging's payments to production's).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/paysvc.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/paysvc.json: %v", err)
	}
	if d.Title == "" || d.UID == "" {
		t.Fatal("the dashboard needs a title and a uid (stable links)")
	}
	exported := map[string]bool{}
	for _, n := range metrics.New().Names() {
		exported[n] = true
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	for _, v := range []string{"namespace", "job"} {
		if vars[v] != "query" {
			t.Errorf("the dashboard has no %s variable (a query variable): %v", v, vars)
		}
	}
	// A metric and its label matchers, if any.
	selector := regexp.MustCompile(`\b(paysvc_[a-z_]+)\b(\{[^}]*\})?`)
	name := regexp.MustCompile(`\bpaysvc_[a-z_]+\b`)
	titles := map[string]bool{}
	for _, p := range d.Panels {
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(m[2], `namespace="$namespace"`) || !strings.Contains(m[2], `job="$job"`) {
					t.Errorf("panel %q queries %s without namespace=\"$namespace\" and job=\"$job\": deployments would merge", p.Title, m[0])
				}
			}
			for _, m := range name.FindAllString(tg.Expr, -1) {
				family := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if !exported[family] {
						family = strings.TrimSuffix(m, suffix)
					}
				}
				if !exported[family] {
					t.Errorf("panel %q queries %s, which paysvc does not export", p.Title, m)
				}
			}
		}
	}
	for _, want := range []string{"Payments/s by result", "Handling latency (delivery to ack)", "Queue depths", "Oldest message age",
		"Dead letters (NEW) by class", "Paused: messages held per dependency", "Payments per transaction (group size)"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}
}
