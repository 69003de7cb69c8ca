package deploy

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "TestPrometheusRulesUpToDate: rewrite the files that are out of date")

// promRules are the prometheus-operator component's PrometheusRules, each
// generated from a rule file of deploy/prometheus (make docs).
var promRules = []struct{ source, target, name string }{
	{"prometheus/alerts.yaml", "k8s/components/prometheus-operator/prometheusrule.yaml", "paysvc"},
	{"prometheus/reconcile-alerts.yaml", "k8s/components/prometheus-operator/reconcile/prometheusrule.yaml", "paysvc-reconcile"},
	{"prometheus/opt-in-alerts.yaml", "k8s/components/prometheus-operator/opt-in/prometheusrule.yaml", "paysvc-opt-in"},
}

// prometheusRule renders a rule file as a PrometheusRule: its header
// comments, then its groups, verbatim (comments included) under spec.
func prometheusRule(source, name string, rules []byte) (string, error) {
	text := string(rules)
	header, groups, ok := strings.Cut(text, "\ngroups:\n")
	if !ok {
		return "", fmt.Errorf("%s: no top-level groups: key", source)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated from deploy/%s by make docs: edit that file, not this one.\n", source)
	b.WriteString(header + "\n")
	fmt.Fprintf(&b, "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: %s\n  labels: {app.kubernetes.io/name: paysvc}\nspec:\n  groups:\n", name)
	for _, line := range strings.SplitAfter(groups, "\n") {
		if strings.TrimSpace(line) == "" {
			b.WriteString(strings.TrimLeft(line, " \t"))
			continue
		}
		b.WriteString("  " + line)
	}
	return b.String(), nil
}

// The component's PrometheusRules carry the rule files' groups: generated
// by make docs, and compared here both as text and as data (a hand edit of
// the generated file, or of the rule file without make docs, fails).
func TestPrometheusRulesUpToDate(t *testing.T) {
	for _, r := range promRules {
		src, err := os.ReadFile(r.source)
		if err != nil {
			t.Fatal(err)
		}
		want, err := prometheusRule(r.source, r.name, src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(r.target)
		if err != nil && !*update {
			t.Fatal(err)
		}
		if string(got) != want {
			if *update {
				if err := os.WriteFile(r.target, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("%s rewritten", r.target)
				got = []byte(want)
			} else {
				t.Errorf("%s is not %s's rules: run make docs", r.target, r.source)
			}
		}
		var file struct {
			Groups any `yaml:"groups"`
		}
		var rule struct {
			APIVersion string `yaml:"apiVersion"`
			Kind       string `yaml:"kind"`
			Spec       struct {
				Groups any `yaml:"groups"`
			} `yaml:"spec"`
		}
		if err := yaml.Unmarshal(src, &file); err != nil {
			t.Fatalf("%s: %v", r.source, err)
		}
		if err := yaml.Unmarshal(got, &rule); err != nil {
			t.Fatalf("%s: %v", r.target, err)
		}
		if rule.Kind != "PrometheusRule" || file.Groups == nil || !reflect.DeepEqual(rule.Spec.Groups, file.Groups) {
			t.Errorf("%s: spec.groups differ from %s's groups", r.target, r.source)
		}
	}
}
