package k8scheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// tree copies deploy/k8s into an in-memory filesystem at /k8s, with an
// extra overlay, production-prometheus: the production overlay with the
// prometheus-operator components.
func tree(t *testing.T) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	root := filepath.Join("..", "..", "deploy", "k8s")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		return mem.WriteFile(filepath.Join("/k8s", rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	write(t, mem, "/k8s/overlays/production-prometheus/kustomization.yaml", `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../production
components:
  - ../../components/prometheus-operator
  - ../../components/prometheus-operator/reconcile
  - ../../components/prometheus-operator/opt-in
`)
	return mem
}

func write(t *testing.T, fsys filesys.FileSystem, path, content string) {
	t.Helper()
	if err := fsys.WriteFile(path, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

// edit replaces old (which must be there) by new in one file of the tree.
func edit(t *testing.T, fsys filesys.FileSystem, path, old, new string) {
	t.Helper()
	b, err := fsys.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s does not hold %q: update the test", path, old)
	}
	write(t, fsys, path, strings.Replace(string(b), old, new, 1))
}

var overlays = []struct {
	dir  string
	opts Options
}{
	{"/k8s/overlays/dev", Options{MinReplicas: 1}},
	{"/k8s/overlays/production", Options{MinReplicas: 2, PinnedImage: true}},
	{"/k8s/overlays/production-prometheus", Options{MinReplicas: 2, PinnedImage: true}},
}

func kinds(objs []Object) map[string]int {
	out := map[string]int{}
	for _, o := range objs {
		out[o.Kind]++
	}
	return out
}

// Every overlay builds, every object decodes strictly into its API type,
// and the policies hold.
func TestOverlays(t *testing.T) {
	fsys := tree(t)
	for _, o := range overlays {
		t.Run(filepath.Base(o.dir), func(t *testing.T) {
			objs, err := Build(fsys, o.dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range Check(objs, o.opts) {
				t.Error(p)
			}
			k := kinds(objs)
			t.Logf("%s: %v", o.dir, k)
			if k["Deployment"] != 1 || k["CronJob"] != 1 || k["NetworkPolicy"] != 2 || k["ConfigMap"] != 1 {
				t.Errorf("objects: %v", k)
			}
			switch filepath.Base(o.dir) {
			case "dev":
				if k["Secret"] != 3 {
					t.Errorf("dev generates the three Secrets: %v", k)
				}
			case "production":
				if k["Secret"] != 0 {
					t.Errorf("production's Secrets are created out of band: %v", k)
				}
			case "production-prometheus":
				if k["PrometheusRule"] != 3 || k["ServiceMonitor"] != 1 {
					t.Errorf("the components add three PrometheusRules and a ServiceMonitor: %v", k)
				}
				for _, obj := range objs {
					if d, ok := obj.Typed.(*appsv1.Deployment); ok && len(d.Spec.Template.Annotations) > 0 {
						t.Errorf("the component leaves the prometheus.io annotations (a second scrape): %v", d.Spec.Template.Annotations)
					}
					if r, ok := obj.Typed.(*monitoringv1.PrometheusRule); ok {
						n := 0
						for _, g := range r.Spec.Groups {
							n += len(g.Rules)
						}
						if n == 0 {
							t.Errorf("PrometheusRule %s holds no rule", r.Name)
						}
					}
				}
			}
		})
	}
	// The base alone builds and decodes (the overlays set what it leaves out).
	if _, err := Build(fsys, "/k8s/base"); err != nil {
		t.Fatal(err)
	}
}

// The Secret volume's mode survives kustomize's YAML (0440, octal) as the
// API server reads it.
func TestSecretModeIsOctal(t *testing.T) {
	objs, err := Build(tree(t), "/k8s/overlays/production")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if d, ok := o.Typed.(*appsv1.Deployment); ok {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o440) {
					t.Errorf("volume %s: defaultMode %v, want 0440", v.Name, v.Secret.DefaultMode)
				}
			}
			return
		}
	}
	t.Fatal("no Deployment")
}

// A field the API types do not have fails the build's decoding, in every
// kind and whatever its case: kustomize passes it through, and an API
// server would drop it (or refuse the object).
func TestMisspelledFieldsFail(t *testing.T) {
	for _, c := range []struct {
		name, file, old, new, overlay string
	}{
		{"case only", "/k8s/base/deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", "production"},
		{"pod field", "/k8s/base/deployment.yaml", "enableServiceLinks: false", "enableServiceLink: false", "production"},
		{"probe field", "/k8s/base/deployment.yaml", "timeoutSeconds: 5", "timeoutSecond: 5", "production"},
		{"cronjob", "/k8s/base/prune-cronjob.yaml", "concurrencyPolicy: Forbid", "concurrencyPolicy: Forbid\n  concurency: Forbid", "dev"},
		{"networkpolicy", "/k8s/base/networkpolicy.yaml", "policyTypes: [Ingress, Egress]", "policyType: [Ingress, Egress]", "dev"},
		{"kind", "/k8s/base/pdb.yaml", "kind: PodDisruptionBudget", "kind: PodDisruptionBudgets", "dev"},
		{"overlay patch", "/k8s/overlays/production/kustomization.yaml", "requests: {cpu: 250m", "request: {cpu: 250m", "production"},
		{"servicemonitor", "/k8s/components/prometheus-operator/servicemonitor.yaml", "path: /metrics", "pth: /metrics", "production-prometheus"},
		{"prometheusrule", "/k8s/components/prometheus-operator/prometheusrule.yaml", "- alert: PaysvcMainQueueLagging", "- alertname: PaysvcMainQueueLagging", "production-prometheus"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fsys := tree(t)
			dir := "/k8s/overlays/" + c.overlay
			if _, err := Build(fsys, dir); err != nil {
				t.Fatalf("unbroken: %v", err)
			}
			edit(t, fsys, c.file, c.old, c.new)
			_, err := Build(fsys, dir)
			if err == nil {
				t.Fatalf("%s: %q built and decoded", c.file, c.new)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// Each break of a policy is caught: the checks can fail.
func TestPolicyViolationsFail(t *testing.T) {
	for _, c := range []struct {
		name, file, old, new, overlay, want string
	}{
		// The daemon's container mounts the migration user's Secret.
		{"migrate secret mounted into the daemon", "/k8s/base/deployment.yaml",
			"            - {name: tmp, mountPath: /tmp}",
			"            - {name: tmp, mountPath: /tmp}\n            - {name: migrate-secrets, mountPath: /run/secrets/paysvc-migrate, readOnly: true}",
			"production", "container paysvc can read Deployment paysvc container migrate's DSN"},
		// One Secret for all again: the daemon's volume holds the migrate key.
		{"one Secret for both", "/k8s/base/deployment.yaml",
			"secret: {secretName: paysvc-migrate, defaultMode: 0440}", "secret: {secretName: paysvc, defaultMode: 0440}",
			"production", "can read Deployment paysvc container migrate's DSN"},
		// An overlay hands the daemon the migrate DSN in its environment.
		{"migrate DSN in the daemon's env", "/k8s/overlays/production/kustomization.yaml",
			"                resources:\n",
			"                env:\n                  - name: MIGRATE_DSN\n                    valueFrom: {secretKeyRef: {name: paysvc-migrate, key: mysql_dsn}}\n                resources:\n",
			"production", "container paysvc can read"},
		// The dev overlay's generated Secrets (hash-suffixed names) too.
		{"dev: migrate secret mounted into the daemon", "/k8s/base/deployment.yaml",
			"            - {name: tmp, mountPath: /tmp}",
			"            - {name: tmp, mountPath: /tmp}\n            - {name: migrate-secrets, mountPath: /run/secrets/paysvc-migrate, readOnly: true}",
			"dev", "container paysvc can read Deployment paysvc container migrate's DSN"},
		{"prune reads the daemon's Secret", "/k8s/base/prune-cronjob.yaml",
			"secret: {secretName: paysvc-prune, defaultMode: 0440}", "secret: {secretName: paysvc, defaultMode: 0440}",
			"production", "same DSN"},
		{"probe timeout left to the default", "/k8s/base/deployment.yaml", "            timeoutSeconds: 3\n", "", "production", "readinessProbe: timeoutSeconds 0"},
		{"GOMEMLIMIT", "/k8s/base/deployment.yaml", "            - {name: PAYSVC_HTTP_ADDR,", "            - {name: GOMEMLIMIT, value: 256MiB}\n            - {name: PAYSVC_HTTP_ADDR,", "production", "sets GOMEMLIMIT"},
		{"no resources", "/k8s/overlays/production/kustomization.yaml", "                  limits: {cpu: \"1\", memory: 256Mi}\n", "", "production", "no cpu request or limit"},
		{"root", "/k8s/base/deployment.yaml", "runAsNonRoot: true", "runAsNonRoot: false", "production", "non-root"},
		{"writable root", "/k8s/base/prune-cronjob.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "production", "container prune: want a read-only root"},
		{"metrics from anywhere", "/k8s/base/networkpolicy.yaml", "matchLabels: {kubernetes.io/metadata.name: monitoring}", "matchLabels: {}", "production", "ingress to 8080"},
		{"admin from monitoring", "/k8s/base/networkpolicy.yaml", "matchLabels: {paysvc.io/admin: allowed}", "matchLabels: {kubernetes.io/metadata.name: monitoring}", "production", "ingress to 8081"},
		{"no OTLP egress", "/k8s/base/networkpolicy.yaml", "        - {port: 4318, protocol: TCP}", "", "production", "no egress to 4318/TCP"},
		{"prune talks to Redis", "/k8s/base/networkpolicy.yaml", "        - {port: 3306, protocol: TCP} # MySQL", "        - {port: 3306, protocol: TCP}\n        - {port: 6379, protocol: TCP}", "production", "egress to 6379/TCP"},
		{"prune pods in the PDB", "/k8s/base/prune-cronjob.yaml", "          labels: {app.kubernetes.io/name: paysvc-prune,", "          labels: {app.kubernetes.io/name: paysvc,", "production", "not the prune job's"},
		{"dev image in production", "/k8s/overlays/production/kustomization.yaml", "newTag: 1.1.0", "newTag: dev", "production", "not a release"},
		{"one replica in production", "/k8s/overlays/production/kustomization.yaml", "count: 3", "count: 1", "production", "replicas"},
		{"admin port missing from the Service", "/k8s/base/service.yaml", "    - {name: admin, port: 8081, targetPort: admin, protocol: TCP}\n", "", "production", "no port"},
		{"ServiceMonitor on a port the Service lacks", "/k8s/components/prometheus-operator/servicemonitor.yaml", "port: http", "port: metrics", "production-prometheus", "ServiceMonitor paysvc: endpoint port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fsys := tree(t)
			edit(t, fsys, c.file, c.old, c.new)
			objs, err := Build(fsys, "/k8s/overlays/"+c.overlay)
			if err != nil {
				t.Fatal(err)
			}
			problems := Check(objs, overlayOpts(c.overlay))
			for _, p := range problems {
				if strings.Contains(p, c.want) {
					t.Logf("caught: %s", p)
					return
				}
			}
			t.Errorf("no problem mentions %q: %q", c.want, problems)
		})
	}
}

func overlayOpts(name string) Options {
	for _, o := range overlays {
		if filepath.Base(o.dir) == name {
			return o.opts
		}
	}
	panic(name)
}
