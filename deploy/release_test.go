package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// makeIn runs make with args in the repository's root and returns what it
// printed (both streams) and its error.
func makeIn(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-s", "--no-print-directory"}, args...)...)
	cmd.Dir = ".."
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") && !strings.HasPrefix(kv, "VERSION=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The VERSION file holds a semantic version, a release's with its entry in
// CHANGELOG.md; make build stamps it and the checkout's commit into the
// binary, and `paysvc version` reports both.
func TestMakeBuildReportsTheVersionFile(t *testing.T) {
	b, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(b))
	m := regexp.MustCompile(`^\d+\.\d+\.\d+(-dev|-rc\.\d+)?$`).FindStringSubmatch(v)
	if m == nil {
		t.Fatalf("VERSION %q: want X.Y.Z, X.Y.Z-rc.N or X.Y.Z-dev", v)
	}
	changelog, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if m[1] != "-dev" && !regexp.MustCompile(`(?m)^## \[`+regexp.QuoteMeta(v)+`\] - \d{4}-\d{2}-\d{2}$`).Match(changelog) {
		t.Errorf("VERSION %s is a release with no entry in CHANGELOG.md", v)
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	bin := t.TempDir()
	if out, err := makeIn(t, "build", "BIN="+bin); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	got, err := exec.Command(filepath.Join(bin, "paysvc"), "version").Output()
	if want := "paysvc " + v + " revision " + string(rev[:12]); err != nil || !strings.HasPrefix(string(got), want) {
		t.Fatalf("paysvc version: %q, %v; want %q...", got, err, want)
	}
}

// make release builds only a release with its changelog entry, from a
// commit, checks that the binary reports it, and builds the image tagged
// with it, stamped with the same version and revision.
func TestMakeRelease(t *testing.T) {
	for _, c := range []struct{ version, revision, want string }{
		{"1.1.0-dev", "0123456789abcdef0123", "not a release"},
		{"9.9.9", "0123456789abcdef0123", "CHANGELOG.md has no entry '## [9.9.9]"},
		{"1.0.0", "0123456789abcdef0123-dirty", "release a commit, with no uncommitted change"},
	} {
		bin := t.TempDir()
		out, err := makeIn(t, "release", "BIN="+bin, "DOCKER=echo", "VERSION="+c.version, "REVISION="+c.revision)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("make release VERSION=%s REVISION=%s: %v\n%s\nwant a refusal saying %q", c.version, c.revision, err, out, c.want)
		}
		if _, err := os.Stat(filepath.Join(bin, "paysvc")); err == nil {
			t.Errorf("make release VERSION=%s REVISION=%s built the binary it refused", c.version, c.revision)
		}
	}
	bin := t.TempDir()
	out, err := makeIn(t, "release", "BIN="+bin, "DOCKER=echo", "VERSION=1.0.0", "REVISION=0123456789abcdef0123",
		"IMAGE=registry.example.com/paysvc")
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	if want := "build --build-arg VERSION=1.0.0 --build-arg REVISION=0123456789abcdef0123 -t registry.example.com/paysvc:1.0.0 .\n"; !strings.Contains(out, want) {
		t.Errorf("make release printed:\n%s\nwant the image build %q", out, want)
	}
	got, err := exec.Command(filepath.Join(bin, "paysvc"), "version").Output()
	if err != nil || !strings.HasPrefix(string(got), "paysvc 1.0.0 revision 0123456789ab ") {
		t.Fatalf("the released binary's version: %q, %v", got, err)
	}
}
