package main

import (
	"path"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const (
	kustomization = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
	component     = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n"
)

func cm(name string) string {
	return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata: {k: v}\n"
}

// tree writes files (path relative to root -> content) into memory.
func tree(t *testing.T, files map[string]string) filesys.FileSystem {
	t.Helper()
	fsys := filesys.MakeFsInMemory()
	for p, c := range files {
		if err := fsys.MkdirAll(path.Dir(path.Join(root, p))); err != nil {
			t.Fatal(err)
		}
		if err := fsys.WriteFile(path.Join(root, p), []byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	return fsys
}

func names(t *testing.T, fsys filesys.FileSystem, tg target) []string {
	t.Helper()
	objs, err := build(fsys, tg)
	if err != nil {
		t.Fatalf("%s: %v", tg.label, err)
	}
	var out []string
	for _, o := range objs {
		out = append(out, o.kind()+"/"+o.name())
	}
	return out
}

func TestTargetsOverlaysAndComponents(t *testing.T) {
	fsys := tree(t, map[string]string{
		"base/kustomization.yaml":                    kustomization + "resources: [base.yaml]\n",
		"base/base.yaml":                             cm("base"),
		"overlays/dev/kustomization.yaml":            kustomization + "resources: [../../base]\nnamePrefix: dev-\n",
		"overlays/production/kustomization.yaml":     kustomization + "resources: [../../base]\n",
		"components/mon/kustomization.yaml":          component + "resources: [mon.yaml]\n",
		"components/mon/mon.yaml":                    cm("mon"),
		"components/mon/extra/kustomization.yaml":    component + "resources: [extra.yaml]\n",
		"components/mon/extra/extra.yaml":            cm("extra"),
		"components/not-a-component/README":          "no kustomization here",
		"overlays/not-an-overlay/notes.yaml":         cm("ignored"),
		"components/mon/extra/deeper/unrelated.yaml": cm("ignored"),
	})
	ts, err := targets(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, tg := range ts {
		labels = append(labels, tg.label)
	}
	want := []string{
		"overlays/dev",
		"overlays/production",
		"overlays/production+components/mon",
		"overlays/production+components/mon/extra",
		"overlays/production+all components",
	}
	if !reflect.DeepEqual(labels, want) {
		t.Fatalf("targets:\n got %q\nwant %q", labels, want)
	}
	got := map[string][]string{}
	for _, tg := range ts {
		got[tg.label] = names(t, fsys, tg)
	}
	wantObjs := map[string][]string{
		"overlays/dev":                             {"ConfigMap/dev-base"},
		"overlays/production":                      {"ConfigMap/base"},
		"overlays/production+components/mon":       {"ConfigMap/base", "ConfigMap/mon"},
		"overlays/production+components/mon/extra": {"ConfigMap/base", "ConfigMap/extra"},
		"overlays/production+all components":       {"ConfigMap/base", "ConfigMap/mon", "ConfigMap/extra"},
	}
	if !reflect.DeepEqual(got, wantObjs) {
		t.Fatalf("objects:\n got %v\nwant %v", got, wantObjs)
	}
}

func TestTargetsSingleKustomization(t *testing.T) {
	fsys := tree(t, map[string]string{
		"kustomization.yaml": kustomization + "resources: [a.yaml]\n",
		"a.yaml":             cm("a"),
	})
	ts, err := targets(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0].label != "." {
		t.Fatalf("targets: %+v, want the tree itself", ts)
	}
	if got := names(t, fsys, ts[0]); !reflect.DeepEqual(got, []string{"ConfigMap/a"}) {
		t.Fatalf("objects: %v", got)
	}
}

func TestTargetsComponentsWithoutProduction(t *testing.T) {
	fsys := tree(t, map[string]string{
		"overlays/dev/kustomization.yaml":   kustomization,
		"components/mon/kustomization.yaml": component,
	})
	if _, err := targets(fsys); err == nil || !strings.Contains(err.Error(), "overlays/production") {
		t.Fatalf("err = %v, want one naming overlays/production", err)
	}
}

func TestTargetsNothing(t *testing.T) {
	if _, err := targets(tree(t, map[string]string{"a.yaml": cm("a")})); err == nil {
		t.Fatal("a tree with no kustomization gave targets")
	}
}

// The repository's own tree builds, and has the Deployment the negative
// checks mutate, with a container.
func TestRepositoryTreeBuilds(t *testing.T) {
	fsys, err := loadTree("../../deploy/k8s")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := targets(fsys)
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range ts {
		objs, err := build(fsys, tg)
		if err != nil {
			t.Fatalf("%s: %v", tg.label, err)
		}
		deployments := 0
		for _, o := range objs {
			if o.kind() == "Deployment" {
				deployments++
				if container(o)["name"] == "" || podOf(o) == nil {
					t.Errorf("%s: %s: no container or pod template", tg.label, o)
				}
			}
		}
		if deployments == 0 {
			t.Errorf("%s: no Deployment", tg.label)
		}
	}
}

func TestPodOf(t *testing.T) {
	cron := object{
		"apiVersion": "batch/v1", "kind": "CronJob",
		"metadata": map[string]any{"name": "Prune", "namespace": "x"},
		"spec": map[string]any{"jobTemplate": map[string]any{"spec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"a": "b"}},
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "c"}}},
		}}}},
	}
	pod := podOf(cron)
	if pod == nil || pod.kind() != "Pod" || pod.name() != "prune-cronjob-pod" || pod.namespace() != "x" {
		t.Fatalf("podOf(CronJob) = %v", pod)
	}
	if podOf(object{"apiVersion": "v1", "kind": "Service"}) != nil {
		t.Fatal("a Service has a pod")
	}
}

func TestWarningText(t *testing.T) {
	for in, want := range map[string]string{
		`299 - "would violate PodSecurity \"restricted:latest\": privileged"`: `would violate PodSecurity "restricted:latest": privileged`,
		`299 - "unknown field"`: "unknown field",
		"something else":        "something else",
	} {
		if got := warningText(in); got != want {
			t.Errorf("warningText(%q) = %q, want %q", in, got, want)
		}
	}
}
