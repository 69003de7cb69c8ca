package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// target is one kustomization the suite builds: an overlay alone, or the
// production overlay with components added.
type target struct {
	label string // as printed: overlays/dev, overlays/production+components/x
	dir   string // in the in-memory copy of the tree
}

// kustomizationFiles are the names kustomize reads a kustomization from.
var kustomizationFiles = []string{"kustomization.yaml", "kustomization.yml", "Kustomization"}

func isKustomization(fsys filesys.FileSystem, dir string) bool {
	for _, f := range kustomizationFiles {
		if fsys.Exists(path.Join(dir, f)) {
			return true
		}
	}
	return false
}

// subdirs lists the kustomizations directly under dir, sorted.
func subdirs(fsys filesys.FileSystem, dir string) ([]string, error) {
	if !fsys.IsDir(dir) {
		return nil, nil
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if fsys.IsDir(path.Join(dir, n)) && isKustomization(fsys, path.Join(dir, n)) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// root is where loadTree puts the tree in memory.
const root = "/k8s"

// loadTree copies the tree at dir (deploy/k8s) into an in-memory file
// system: the builds of a component with the production overlay need a
// kustomization of the suite's own beside the tree (kustomize takes no
// absolute path to a directory), and the checkout is left untouched.
func loadTree(dir string) (filesys.FileSystem, error) {
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		dst := path.Join(root, filepath.ToSlash(rel))
		if d.IsDir() {
			return mem.MkdirAll(dst)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(dst, b)
	})
	return mem, err
}

// components lists the kustomizations under dir, nested ones too
// (components/prometheus-operator/reconcile), relative to dir, sorted.
func components(fsys filesys.FileSystem, dir string) ([]string, error) {
	var out []string
	var walk func(rel string) error
	walk = func(rel string) error {
		names, err := subdirsAll(fsys, path.Join(dir, rel))
		if err != nil {
			return err
		}
		for _, n := range names {
			r := path.Join(rel, n)
			if isKustomization(fsys, path.Join(dir, r)) {
				out = append(out, r)
			}
			if err := walk(r); err != nil {
				return err
			}
		}
		return nil
	}
	if !fsys.IsDir(dir) {
		return nil, nil
	}
	err := walk("")
	sort.Strings(out)
	return out, err
}

// subdirsAll lists every directory directly under dir.
func subdirsAll(fsys filesys.FileSystem, dir string) ([]string, error) {
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if fsys.IsDir(path.Join(dir, n)) {
			out = append(out, n)
		}
	}
	return out, nil
}

// targets discovers what to build: every overlay under overlays/, alone;
// the production overlay with each component under components/ (nested
// ones too) added, and with all of them at once; with no overlays, the
// tree's own kustomization in place of the overlays.
func targets(fsys filesys.FileSystem) ([]target, error) {
	overlays, err := subdirs(fsys, path.Join(root, "overlays"))
	if err != nil {
		return nil, err
	}
	comps, err := components(fsys, path.Join(root, "components"))
	if err != nil {
		return nil, err
	}
	var out []target
	for _, o := range overlays {
		out = append(out, target{label: "overlays/" + o, dir: path.Join(root, "overlays", o)})
	}
	if len(overlays) == 0 {
		if !isKustomization(fsys, root) {
			return nil, fmt.Errorf("no overlays/*/kustomization.yaml and no kustomization.yaml")
		}
		out = append(out, target{label: ".", dir: root})
	}
	if len(comps) == 0 {
		return out, nil
	}
	base, baseLabel := path.Join(root, "overlays", "production"), "overlays/production"
	if !isKustomization(fsys, base) {
		if len(overlays) > 0 {
			return nil, fmt.Errorf("components/ but no overlays/production to add them to")
		}
		base, baseLabel = root, "."
	}
	sets := make([][]string, 0, len(comps)+1)
	for _, c := range comps {
		sets = append(sets, []string{c})
	}
	if len(comps) > 1 {
		sets = append(sets, comps)
	}
	for i, set := range sets {
		dir := path.Join(root, ".paykube", fmt.Sprintf("t%d", i))
		rel := func(p string) string {
			r, err := filepath.Rel(dir, p)
			if err != nil {
				panic(err)
			}
			return filepath.ToSlash(r)
		}
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n", rel(base))
		label := baseLabel
		for _, c := range set {
			k += fmt.Sprintf("  - %s\n", rel(path.Join(root, "components", c)))
			label += "+components/" + c
		}
		if len(set) > 1 {
			label = baseLabel + "+all components"
		}
		if err := fsys.MkdirAll(dir); err != nil {
			return nil, err
		}
		if err := fsys.WriteFile(path.Join(dir, "kustomization.yaml"), []byte(k)); err != nil {
			return nil, err
		}
		out = append(out, target{label: label, dir: dir})
	}
	return out, nil
}

// build runs kustomize (its Go API: what kubectl apply -k runs) and returns
// the objects.
func build(fsys filesys.FileSystem, t target) ([]object, error) {
	opts := krusty.MakeDefaultOptions()
	rm, err := krusty.MakeKustomizer(opts).Run(fsys, t.dir)
	if err != nil {
		return nil, err
	}
	var out []object
	for _, n := range rm.ToRNodeSlice() {
		b, err := n.MarshalJSON()
		if err != nil {
			return nil, err
		}
		var o object
		if err := json.Unmarshal(b, &o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}
