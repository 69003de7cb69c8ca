package metrics

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// The alert rules parse, name only metrics paysvc exports, and hold the
// thresholds operations asked for.
func TestAlertRules(t *testing.T) {
	var f rulesFile
	for _, file := range []string{"alerts.yaml", "opt-in-alerts.yaml", "reconcile-alerts.yaml"} {
		b, err := os.ReadFile("../../deploy/prometheus/" + file)
		if err != nil {
			t.Fatal(err)
		}
		var one rulesFile
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		if err := dec.Decode(&one); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		f.Groups = append(f.Groups, one.Groups...)
	}
	exported := map[string]bool{}
	m := New()
	m.SetBuild("1.0.0", "abc") // paysvc_build_info has a series once the daemon sets it
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		exported[fam.GetName()] = true
	}
	for _, name := range []string{"paysvc_handle_duration_seconds"} { // histograms export suffixes
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			exported[name+suffix] = true
		}
	}
	metricName := regexp.MustCompile(`paysvc_[a-z_]+`)
	exprs := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v: alert, expr and a summary are required", r)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "[") != strings.Count(r.Expr, "]") {
				t.Errorf("%s: unbalanced brackets in %q", r.Alert, r.Expr)
			}
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				if !exported[m] {
					t.Errorf("%s: %s is not a paysvc metric", r.Alert, m)
				}
			}
			exprs[r.Alert] = strings.Join(strings.Fields(r.Expr), " ") + " for " + r.For + " " + r.Labels["severity"]
		}
	}
	for alert, want := range map[string]string{
		"PaysvcTerminalMessages":         "max by (namespace, job) (paysvc_terminal_pending) > 0 for 5m warning",
		"PaysvcTerminalMessagesCritical": "max by (namespace, job) (paysvc_terminal_pending) > 100 for  critical",
		"PaysvcDuplicateRatioHigh":       `> 0.3 for 10m warning`,
		"PaysvcDegraded":                 "paysvc_degraded) > 0",
		"PaysvcNotReady":                 "paysvc_ready) == 0",
		"PaysvcRetryCopiesOverdue":       "max by (namespace, job) (paysvc_retry_copies_overdue) > 0 for 5m critical",
		"PaysvcPaymentsLost":             "max by (namespace, job) (paysvc_lost_payments) > 0 for  critical",
	} {
		if !strings.Contains(exprs[alert], want) {
			t.Errorf("%s: %q, want it to contain %q", alert, exprs[alert], want)
		}
	}
}
