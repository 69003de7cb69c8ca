package main

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// root is the service's module, whose source the mutants patch.
const root = "../.."

// TestMutantsApplyAndBuild builds paysvc with each mutant applied to the
// current source, as paychaos -mutation does: every edit must find its
// text exactly once, and the patched copy must build and run. A change to
// the code a mutant breaks fails here until the mutant follows it.
func TestMutantsApplyAndBuild(t *testing.T) {
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), "module github.com/paysvc/paysvc\n") {
		t.Fatalf("%s is not the paysvc module: %v", root, err)
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			bin := filepath.Join(t.TempDir(), "paysvc")
			if _, err := buildMutant(ctx, root, m.name, bin); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.CommandContext(ctx, bin, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "paysvc ") {
				t.Fatalf("%s version: %v\n%s", bin, err, out)
			}
			// The patched copies differ from the source, which is left as
			// it was.
			overlay, err := m.patch(root, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			for orig, patched := range overlay {
				a, _ := os.ReadFile(orig)
				b, _ := os.ReadFile(patched)
				if len(a) == 0 || string(a) == string(b) {
					t.Errorf("%s: the patched copy of %s changes nothing", m.name, orig)
				}
				if strings.Contains(string(a), m.name) {
					t.Errorf("%s names %s: the defect is in the source", orig, m.name)
				}
			}
		})
	}
}

// TestNoMutantInTheSource: the service's own Go source names no mutant;
// the defects live in mutants.go only.
func TestNoMutantInTheSource(t *testing.T) {
	for _, dir := range []string{"cmd", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range mutants {
				if strings.Contains(string(b), m.name) {
					t.Errorf("%s names the mutant %s", path, m.name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestPatchRefusesTextNotFoundOnce(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.go"), []byte("package a\n\nimport (\n\t\"fmt\"\n)\n\nvar x, y = 1, 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"var z", " 1"} { // none, twice
		m := mutant{name: "m", edits: []edit{{file: "a.go", old: old, new: "var w"}}}
		if _, err := m.patch(src, t.TempDir()); err == nil || !strings.Contains(err.Error(), "not once") {
			t.Errorf("patch of %q: %v, want an error saying the text is not there once", old, err)
		}
	}
	m := mutant{name: "m", edits: []edit{{file: "a.go", old: "var x, y = 1, 1\n", new: "var x, y = 1, os.Exit\n", imports: []string{"os", "fmt"}}}}
	overlay, err := m.patch(src, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(filepath.Join(src, "a.go"))
	b, err := os.ReadFile(overlay[abs])
	if err != nil {
		t.Fatal(err)
	}
	want := "package a\n\nimport (\n\t\"os\"\n\t\"fmt\"\n)\n\nvar x, y = 1, os.Exit\n"
	if string(b) != want {
		t.Errorf("patched:\n%s\nwant:\n%s", b, want)
	}
}

func TestMutantNamed(t *testing.T) {
	for _, name := range []string{"park_unavailable", "exit_on_pause", "mark_before_work"} {
		if m, err := mutantNamed(name); err != nil || m.name != name || len(m.edits) == 0 || m.breaks == "" {
			t.Errorf("mutantNamed(%q) = %+v, %v", name, m, err)
		}
	}
	if _, err := mutantNamed("nope"); err == nil || !strings.Contains(err.Error(), "park_unavailable") {
		t.Errorf("mutantNamed(nope): %v, want an error listing the known names", err)
	}
}
