package deploy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paysvc/paysvc/internal/metrics"
)

type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// anchors are the GitHub anchors of a Markdown file's headings.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			a := strings.ToLower(strings.TrimSpace(h))
			a = regexp.MustCompile(`[^a-z0-9 -]`).ReplaceAllString(a, "")
			out[strings.ReplaceAll(a, " ", "-")] = true
		}
	}
	return out
}

// Every alert names only metrics paysvc exports, links a runbook section
// that exists in docs/operations.md, and is shown firing by a promtool unit
// test (make test runs promtool on those); the rules that need
// reconcile.interval > 0 are not among the default ones.
// offByDefault: metrics that never move with paysvc's default
// configuration, and the setting that makes them move. A rule on one of
// them could never fire with the defaults, so it lives in
// reconcile-alerts.yaml or opt-in-alerts.yaml, loaded where it applies.
var offByDefault = map[string]string{
	"paysvc_reconcile_":                   "reconcile.interval > 0",
	"paysvc_degraded":                     "idempotent.redisFallback OPEN",
	"paysvc_alert_webhook_failures_total": "alert.webhookUrl",
}

// aggregation matches an aggregation operator and its by (...) labels
// (empty: none, or without).
var aggregation = regexp.MustCompile(`\b(sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\s*(?:by\s*\(([^)]*)\)|without\s*\([^)]*\))?\s*\(`)

func TestAlertRules(t *testing.T) {
	exported := map[string]bool{"up": true}
	for _, n := range metrics.New().Names() {
		exported[n] = true
	}
	runbooks := anchors(t, "../docs/operations.md")
	metricName := regexp.MustCompile(`\b(paysvc_[a-z_]+)\b`)
	for file, tests := range map[string]string{
		"prometheus/alerts.yaml":           "prometheus/alerts_test.yaml",
		"prometheus/reconcile-alerts.yaml": "prometheus/reconcile-alerts_test.yaml",
		"prometheus/opt-in-alerts.yaml":    "prometheus/opt-in-alerts_test.yaml",
	} {
		var rf ruleFile
		readYAML(t, file, &rf)
		var rt ruleTests
		readYAML(t, tests, &rt)
		fired := map[string]bool{}
		for _, tc := range rt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fired[a.Alertname] = true
				}
			}
		}
		n := 0
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				n++
				for _, m := range metricName.FindAllString(r.Expr, -1) {
					if !exported[m] && !exported[strings.TrimSuffix(m, "_bucket")] {
						t.Errorf("%s %s: paysvc exports no metric %s", file, r.Alert, m)
					}
				}
				// One Prometheus may watch several deployments: every
				// aggregation keeps namespace and job, and absent(), which
				// keeps no label, serves only the rule for none anywhere.
				for _, m := range aggregation.FindAllStringSubmatch(r.Expr, -1) {
					by := strings.Fields(strings.ReplaceAll(m[2], ",", " "))
					if !slices.Contains(by, "namespace") || !slices.Contains(by, "job") {
						t.Errorf("%s %s: %q aggregates without namespace and job: staging and production would merge", file, r.Alert, m[0])
					}
				}
				if strings.Contains(r.Expr, "absent(") && r.Alert != "PaysvcAbsentEverywhere" {
					t.Errorf("%s %s: absent() keeps no namespace: use the per-deployment form of PaysvcAbsent", file, r.Alert)
				}
				url := r.Annotations["runbook_url"]
				anchor, ok := strings.CutPrefix(url, "https://github.com/paysvc/paysvc/blob/main/docs/operations.md#")
				if !ok || !runbooks[anchor] {
					t.Errorf("%s %s: runbook_url %q is not a section of docs/operations.md", file, r.Alert, url)
				}
				if !fired[r.Alert] {
					t.Errorf("%s %s: no promtool test shows it firing (%s)", file, r.Alert, tests)
				}
				if file == "prometheus/alerts.yaml" {
					for metric, setting := range offByDefault {
						if strings.Contains(r.Expr, metric) {
							t.Errorf("%s %s: %s moves only with %s, off by default: the rule belongs with the opt-in ones", file, r.Alert, metric, setting)
						}
					}
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no rules", file)
		}
	}
}
