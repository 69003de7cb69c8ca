package metrics

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// paysvc_build_info is one series at 1, labelled with the release, the
// revision and the Go version; set again, it replaces its series.
func TestBuildInfo(t *testing.T) {
	m := New()
	m.SetBuild("0.9.0", "old")
	m.SetBuild("1.2.3", "0123456789abcdef0123-dirty")
	want := `# HELP paysvc_build_info 1, labelled with the release (the VERSION file), the VCS revision and the Go version the binary was built from.
# TYPE paysvc_build_info gauge
paysvc_build_info{goversion="` + runtime.Version() + `",revision="0123456789abcdef0123-dirty",version="1.2.3"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "paysvc_build_info"); err != nil {
		t.Fatal(err)
	}
}

// Every metric paysvc exports is in the list of docs/operations.md's
// Metrics section.
func TestEveryMetricIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/operations.md has no Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, name := range New().Names() {
		if !strings.Contains(section, "`"+name+"`") && !strings.Contains(section, "`"+name+"{") {
			t.Errorf("%s is not in docs/operations.md's list of metrics", name)
		}
	}
}
