package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// A mutant is a deliberately broken paysvc: the suite run against it must
// fail, which shows that it can. Its defects live here, never in the
// service's source: buildMutant applies its edits to copies of the files
// they touch and builds paysvc (tag faultinject) with those copies in place
// of the originals (go build -overlay), leaving the source tree as it is.
// TestMutantsApplyAndBuild checks that every edit still finds its text in
// the current source and that the patched package builds, so a change to
// the code a mutant breaks fails the tests until the mutant follows it.
type mutant struct {
	name   string
	breaks string // what the defect does, and which checks it fails
	edits  []edit
}

// An edit replaces the one occurrence of old in file (relative to the
// module root) with new, and adds imports the new text needs.
type edit struct {
	file     string
	old, new string
	imports  []string
}

// mutants are the deliberate defects paychaos -mutation NAME builds.
var mutants = []mutant{
	{
		name: "park_unavailable",
		breaks: "no message waits out an outage: an outage's outcome is dead-lettered " +
			"(accounted fails: payable not PAID)",
		edits: []edit{
			{file: "internal/listener/process.go",
				old: "\t\tif r := c.pausedFor(); r != ReasonNone {\n",
				new: "\t\tif r := c.pausedFor(); r != ReasonNone && false { // park_unavailable: no message waits out a pause\n"},
			{file: "internal/listener/process.go",
				old: "\t\tif out.kind != Unavailable {\n",
				new: "\t\tif true || out.kind != Unavailable { // park_unavailable: no message is held through an outage\n"},
			{file: "internal/listener/process.go",
				old: "\ta := route(out, d.Headers, c.cfg.Retry, letGo)\n",
				new: "\trouted := out\n" +
					"\tif routed.kind == Unavailable {\n" +
					"\t\trouted.kind = Terminal // park_unavailable: outages dead-letter payable payments\n" +
					"\t}\n" +
					"\ta := route(routed, d.Headers, c.cfg.Retry, letGo)\n"},
		},
	},
	{
		name:   "exit_on_pause",
		breaks: "exits 3 on an outage (exits fails where the restart would hide it)",
		edits: []edit{
			{file: "internal/listener/process.go",
				old: "\tif c.paused.Add(1) == 1 {\n",
				new: "\tif c.paused.Add(1) == 1 {\n" +
					"\t\tos.Exit(3) // exit_on_pause: crashes on an outage\n",
				imports: []string{"os"}},
		},
	},
	{
		name: "mark_before_work",
		breaks: "the key marked done before the work and a done key trusted without the database: " +
			"a crash or a failure after the mark loses the payment (accounted and redis-done fail)",
		edits: []edit{
			{file: "internal/listener/handle.go",
				old: "\theld = cs.state == idem.Claimed\n",
				new: "\theld = cs.state == idem.Claimed\n" +
					"\t// mark_before_work: the key marked done before the work, a done key trusted alone.\n" +
					"\tif cs.state == idem.Done {\n" +
					"\t\treturn classified(fmt.Errorf(\"order %s: key done (mark_before_work): %w\", p.OrderNo, order.ErrAlreadyPaid))\n" +
					"\t}\n" +
					"\tif held {\n" +
					"\t\tc.guard.Done(ctx, p.OrderNo)\n" +
					"\t\theld = false\n" +
					"\t}\n",
				imports: []string{"fmt", "github.com/paysvc/paysvc/internal/order"}},
		},
	},
}

// mutantNamed returns the mutant called name.
func mutantNamed(name string) (mutant, error) {
	for _, m := range mutants {
		if m.name == name {
			return m, nil
		}
	}
	names := make([]string, len(mutants))
	for i, m := range mutants {
		names[i] = m.name
	}
	return mutant{}, fmt.Errorf("no mutation %q (known: %s)", name, strings.Join(names, ", "))
}

// patch writes the files m edits, edited, into dir and returns the
// overlay that puts them in place of the originals under root (absolute
// paths, as go build -overlay takes them). Every edit's old text must occur
// exactly once in its file.
func (m mutant) patch(root, dir string) (map[string]string, error) {
	texts := map[string]string{}
	var files []string
	for _, e := range m.edits {
		text, ok := texts[e.file]
		if !ok {
			b, err := os.ReadFile(filepath.Join(root, e.file))
			if err != nil {
				return nil, fmt.Errorf("mutation %s: %w", m.name, err)
			}
			text = string(b)
			files = append(files, e.file)
		}
		if n := strings.Count(text, e.old); n != 1 {
			return nil, fmt.Errorf("mutation %s: %s holds the text to replace %d times, not once (has the code changed? follow it in tools/paychaos/mutants.go):\n%s",
				m.name, e.file, n, e.old)
		}
		text = strings.Replace(text, e.old, e.new, 1)
		for _, imp := range e.imports {
			var err error
			if text, err = addImport(text, imp); err != nil {
				return nil, fmt.Errorf("mutation %s: %s: %w", m.name, e.file, err)
			}
		}
		texts[e.file] = text
	}
	overlay := map[string]string{}
	for i, f := range files {
		orig, err := filepath.Abs(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		patched := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(f)))
		if err := os.WriteFile(patched, []byte(texts[f]), 0o644); err != nil {
			return nil, err
		}
		overlay[orig] = patched
	}
	return overlay, nil
}

// addImport adds path to a Go file's parenthesized import block, unless
// the file imports it already.
func addImport(text, path string) (string, error) {
	quoted := "\t\"" + path + "\"\n"
	if strings.Contains(text, quoted) || strings.Contains(text, " \""+path+"\"\n") {
		return text, nil
	}
	const block = "\nimport (\n"
	if !strings.Contains(text, block) {
		return "", fmt.Errorf("no import block to add %q to", path)
	}
	return strings.Replace(text, block, block+quoted, 1), nil
}

// goBuild runs go build -tags faultinject args... in root with the
// overlay: the patched copies in place of the originals.
func goBuild(ctx context.Context, root string, overlay map[string]string, dir string, args ...string) error {
	b, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		return err
	}
	file := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", slices.Concat([]string{"build", "-tags", "faultinject", "-overlay", file}, args)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// buildMutant builds paysvc from the source tree at root with mutant name
// applied, as out; the patched copies go to a temporary directory.
func buildMutant(ctx context.Context, root, name, out string) (mutant, error) {
	m, err := mutantNamed(name)
	if err != nil {
		return m, err
	}
	dir, err := os.MkdirTemp("", "paychaos-mutant-")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(dir)
	overlay, err := m.patch(root, dir)
	if err != nil {
		return m, err
	}
	if out, err = filepath.Abs(out); err != nil {
		return m, err
	}
	return m, goBuild(ctx, root, overlay, dir, "-o", out, "./cmd/paysvc")
}
