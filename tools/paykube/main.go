// Command paykube checks paysvc's Kubernetes manifests against a real API
// server: an etcd and a kube-apiserver of its own on loopback (binaries
// from scripts/build-k8s.sh), removed at the end.
//
// Every kustomization under -dir (each overlay under overlays/, alone; the
// production overlay with each component under components/ added; with no
// overlays, -dir's own) is built with kustomize's Go API, and each object
// is sent as a server-side apply, dry run (?dryRun=All: admitted and
// validated in full, never stored), with strict field validation, into a
// namespace that enforces the Pod Security Standard "restricted". The pod
// template of every workload is also sent as a Pod of its own (dry run):
// enforcement applies to pods, a Deployment only draws a warning. Any
// error, and any Warning header, fails the run.
//
// The custom resources' kinds (PrometheusRule, ServiceMonitor, ...) are
// installed first, for real, from the CustomResourceDefinitions in -crds,
// so those objects are checked against their schemas; a kind the server
// does not serve fails.
//
// Then it checks that it can fail: mutated copies of objects the server
// accepted (a misspelled field, a field given twice, a privileged
// container, an unknown field in a custom resource) must be refused, or
// warned about, and caught exactly as the real checks catch a problem. A
// server whose validation or admission were off, or a request without
// strict field validation, fails the run.
//
// The last line: "paykube: N passed, M failed". Exit status 1 on a failure.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/kustomize/kyaml/kio"
)

// testNamespace receives the objects that name no namespace.
const testNamespace = "paysvc-test"

func main() {
	dir := flag.String("dir", "deploy/k8s", "the manifests: overlays/*, components/*, or one kustomization")
	bins := flag.String("bin", "", "the directory holding etcd and kube-apiserver (scripts/build-k8s.sh)")
	crds := flag.String("crds", "", "a directory of CustomResourceDefinition YAML files, installed as needed")
	timeout := flag.Duration("start-timeout", 90*time.Second, "how long etcd and kube-apiserver may take to get ready")
	flag.Parse()
	if *bins == "" {
		fmt.Fprintln(os.Stderr, "paykube: -bin is required (scripts/build-k8s.sh prints it)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := &suite{}
	err := s.run(ctx, *dir, filepath.Join(*bins, "etcd"), filepath.Join(*bins, "kube-apiserver"), *crds, *timeout)
	if err != nil {
		s.fail("%v", err)
	}
	fmt.Printf("paykube: %d passed, %d failed\n", s.passed, s.failed)
	if s.failed > 0 {
		os.Exit(1)
	}
}

type suite struct {
	api            *api
	passed, failed int
	namespaces     map[string]bool
	accounts       map[string]bool
	// The first Deployment, and the first object of each custom kind, the
	// server accepted: what the negative checks mutate (a copy of an
	// object refused already would prove nothing).
	workload object
	customs  map[string]object
	// Deployments seen, accepted or not.
	deployments int
}

func (s *suite) pass(format string, args ...any) {
	s.passed++
	fmt.Printf("ok    "+format+"\n", args...)
}

func (s *suite) fail(format string, args ...any) {
	s.failed++
	fmt.Printf("FAIL  "+format+"\n", args...)
}

// built is one target's objects.
type built struct {
	target  target
	objects []object
}

func (s *suite) run(ctx context.Context, dir, etcdBin, apiBin, crdDir string, timeout time.Duration) error {
	fsys, err := loadTree(dir)
	if err != nil {
		return err
	}
	ts, err := targets(fsys)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	var builds []built
	for _, t := range ts {
		objs, err := build(fsys, t)
		if err != nil {
			s.fail("%s: kustomize build: %v", t.label, err)
			continue
		}
		fmt.Printf("      %s: %d objects\n", t.label, len(objs))
		builds = append(builds, built{t, objs})
	}

	started := time.Now()
	c, err := startCluster(ctx, etcdBin, apiBin, timeout)
	if err != nil {
		return err
	}
	defer c.close()
	fmt.Printf("      etcd and kube-apiserver ready in %.1f s (%s)\n", time.Since(started).Seconds(), c.url)
	s.api = &api{base: c.url, client: c.client}

	if err := s.ensureNamespace(ctx, testNamespace); err != nil {
		return err
	}
	if err := s.installCRDs(ctx, builds, crdDir); err != nil {
		return err
	}
	for _, b := range builds {
		for _, o := range b.objects {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.check(ctx, b.target.label, o)
		}
	}
	s.negative(ctx)
	return ctx.Err()
}

// ensureNamespace creates the namespace, for real, enforcing (and warning
// and auditing) the restricted Pod Security Standard, with its default
// ServiceAccount (no controller manager runs to make it, and the
// ServiceAccount admission of a Pod needs it).
func (s *suite) ensureNamespace(ctx context.Context, ns string) error {
	if s.namespaces[ns] {
		return nil
	}
	labels := map[string]any{}
	for _, mode := range []string{"enforce", "warn", "audit"} {
		labels["pod-security.kubernetes.io/"+mode] = "restricted"
		labels["pod-security.kubernetes.io/"+mode+"-version"] = "latest"
	}
	o := object{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns, "labels": labels}}
	r, err := s.api.apply(ctx, o, "", false)
	if err != nil {
		return err
	}
	if !r.ok() {
		return fmt.Errorf("create namespace %s: %s", ns, r)
	}
	if s.namespaces == nil {
		s.namespaces = map[string]bool{}
	}
	s.namespaces[ns] = true
	return s.ensureServiceAccount(ctx, ns, "default")
}

// ensureServiceAccount creates an empty ServiceAccount, for real: a Pod
// that names one is refused where it does not exist.
func (s *suite) ensureServiceAccount(ctx context.Context, ns, name string) error {
	key := ns + "/" + name
	if s.accounts[key] {
		return nil
	}
	o := object{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": name, "namespace": ns}}
	r, err := s.api.apply(ctx, o, ns, false)
	if err != nil {
		return err
	}
	if !r.ok() {
		return fmt.Errorf("create service account %s: %s", key, r)
	}
	if s.accounts == nil {
		s.accounts = map[string]bool{}
	}
	s.accounts[key] = true
	return nil
}

// installCRDs installs, for real, the CustomResourceDefinition of every
// kind the builds use that the server does not serve, when crdDir has it.
func (s *suite) installCRDs(ctx context.Context, builds []built, crdDir string) error {
	type gk struct{ group, kind string }
	missing := map[gk]bool{}
	for _, b := range builds {
		for _, o := range b.objects {
			if _, err := s.api.resourceOf(ctx, o.apiVersion(), o.kind()); err != nil {
				group, _, _ := strings.Cut(o.apiVersion(), "/")
				missing[gk{group, o.kind()}] = true
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if crdDir == "" {
		return nil // each such object fails, saying why
	}
	files, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		nodes, err := (&kio.ByteReader{Reader: bytes.NewReader(b), OmitReaderAnnotations: true}).Read()
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, n := range nodes {
			if n.GetKind() != "CustomResourceDefinition" {
				continue
			}
			j, err := n.MarshalJSON()
			if err != nil {
				return err
			}
			var crd object
			if err := json.Unmarshal(j, &crd); err != nil {
				return err
			}
			key := gk{crd.str("spec", "group"), crd.str("spec", "names", "kind")}
			if !missing[key] {
				continue
			}
			r, err := s.api.apply(ctx, crd, "", false)
			if err != nil {
				return err
			}
			if !r.ok() {
				return fmt.Errorf("install %s (%s): %s", crd.name(), f, r)
			}
			for _, w := range r.warnings {
				fmt.Printf("      note: installing %s: warning: %s\n", crd.name(), w)
			}
			if err := s.api.waitEstablished(ctx, crd, 60*time.Second); err != nil {
				return err
			}
			fmt.Printf("      installed CustomResourceDefinition %s (from %s)\n", crd.name(), filepath.Base(f))
			delete(missing, key)
		}
	}
	for k := range missing {
		fmt.Printf("      no CustomResourceDefinition for %s (group %s) in %q\n", k.kind, k.group, crdDir)
	}
	return nil
}

// problems is what the suite holds against an answer: an error, or any
// warning. Every check, the negative ones too, judges with it.
func problems(r result) []string {
	var out []string
	if !r.ok() {
		out = append(out, "refused: "+r.String())
	}
	for _, w := range r.warnings {
		out = append(out, "warning: "+w)
	}
	return out
}

// check applies the object (dry run); for a workload, its pod template as
// a Pod too.
func (s *suite) check(ctx context.Context, label string, o object) {
	if ns := o.namespace(); ns != "" {
		if err := s.ensureNamespace(ctx, ns); err != nil {
			s.fail("%s: %s: %v", label, o, err)
			return
		}
	}
	r, err := s.api.apply(ctx, o, testNamespace, true)
	if err != nil {
		s.fail("%s: %s: %v", label, o, err)
		return
	}
	if o.kind() == "Deployment" {
		s.deployments++
	}
	if p := problems(r); len(p) > 0 {
		s.fail("%s: %s:\n        %s", label, o, strings.Join(p, "\n        "))
	} else {
		s.pass("%s: %s", label, o)
		if o.kind() == "Deployment" && s.workload == nil {
			s.workload = o
		}
		if _, builtin := builtinGroups[groupOf(o.apiVersion())]; !builtin {
			if s.customs == nil {
				s.customs = map[string]object{}
			}
			if _, ok := s.customs[o.kind()]; !ok {
				s.customs[o.kind()] = o
			}
		}
	}
	if pod := podOf(o); pod != nil {
		s.checkPod(ctx, label, o, pod)
	}
}

func (s *suite) checkPod(ctx context.Context, label string, owner, pod object) {
	r, err := s.applyPod(ctx, pod)
	if err != nil {
		s.fail("%s: %s, its pod template as a Pod: %v", label, owner, err)
		return
	}
	if p := problems(r); len(p) > 0 {
		s.fail("%s: %s, its pod template as a Pod:\n        %s", label, owner, strings.Join(p, "\n        "))
	} else {
		s.pass("%s: %s, its pod template as a Pod", label, owner)
	}
}

func (s *suite) applyPod(ctx context.Context, pod object) (result, error) {
	ns := pod.namespace()
	if ns == "" {
		ns = testNamespace
	}
	if spec, ok := pod["spec"].(map[string]any); ok {
		if sa, _ := spec["serviceAccountName"].(string); sa != "" {
			if err := s.ensureServiceAccount(ctx, ns, sa); err != nil {
				return result{}, err
			}
		}
	}
	return s.api.apply(ctx, pod, ns, true)
}

// podOf is the Pod a workload's controller would create from its template,
// or nil for an object that is not a workload.
func podOf(o object) object {
	var tmpl any
	spec, _ := o["spec"].(map[string]any)
	switch o.kind() {
	case "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "ReplicationController":
		tmpl = spec["template"]
	case "CronJob":
		if jt, ok := spec["jobTemplate"].(map[string]any); ok {
			if js, ok := jt["spec"].(map[string]any); ok {
				tmpl = js["template"]
			}
		}
	default:
		return nil
	}
	t, ok := tmpl.(map[string]any)
	if !ok {
		return nil
	}
	t = object(t).clone()
	meta, _ := t["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["name"] = strings.ToLower(o.name() + "-" + o.kind() + "-pod")
	if ns := o.namespace(); ns != "" {
		meta["namespace"] = ns
	}
	return object{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": t["spec"]}
}

// negative checks that the suite can fail: mutated copies of the objects
// must draw the problem each mutation plants, judged as the real checks
// judge. Each failure to draw it fails the run.
func (s *suite) negative(ctx context.Context) {
	workload, customs := s.workload, s.customs
	if workload == nil {
		if s.deployments > 0 {
			fmt.Println("      negative checks not run: the server accepted no Deployment to mutate")
		} else {
			s.fail("negative checks: no Deployment in the manifests to mutate")
		}
		return
	}
	expect := func(what string, r result, err error, want string) {
		if err != nil {
			s.fail("negative check, %s: %v", what, err)
			return
		}
		for _, p := range problems(r) {
			if strings.Contains(p, want) {
				s.pass("negative check, %s: caught (%s)", what, firstLine(p))
				return
			}
		}
		s.fail("negative check, %s: not caught (want a problem mentioning %q; got %v)", what, want, problems(r))
	}

	// A misspelled field: not in the schema, so the apply is refused.
	typo := workload.clone()
	container(typo)["securityContxt"] = map[string]any{"runAsNonRoot": true}
	r, err := s.api.apply(ctx, typo, testNamespace, true)
	expect(fmt.Sprintf("%s with a misspelled field (securityContxt)", workload), r, err, "securityContxt")

	// A field given twice: strict field validation refuses it (with
	// fieldValidation=Ignore the server would take the last one silently;
	// an unknown field, above, is refused by any apply).
	dup, err := json.Marshal(workload)
	if err == nil {
		i := bytes.Index(dup, []byte(`"spec":{`))
		if i < 0 {
			err = fmt.Errorf("no spec in %s", dup)
		} else {
			i += len(`"spec":{`)
			dup = append(dup[:i:i], append([]byte(`"minReadySeconds":1,"minReadySeconds":2,`), dup[i:]...)...)
			r, err = s.api.applyBody(ctx, workload, testNamespace, true, dup)
		}
	}
	expect(fmt.Sprintf("%s with a field given twice (minReadySeconds)", workload), r, err, `"minReadySeconds" already set`)

	// A privileged container: the Deployment draws PodSecurity's warning,
	// and its Pod is refused.
	priv := workload.clone()
	sc, _ := container(priv)["securityContext"].(map[string]any)
	if sc == nil {
		sc = map[string]any{}
		container(priv)["securityContext"] = sc
	}
	sc["privileged"] = true
	sc["allowPrivilegeEscalation"] = true // privileged implies it; false is invalid
	r, err = s.api.apply(ctx, priv, testNamespace, true)
	expect(fmt.Sprintf("%s with a privileged container", workload), r, err, "PodSecurity")
	r, err = s.applyPod(ctx, podOf(priv))
	expect(fmt.Sprintf("%s with a privileged container, as a Pod", workload), r, err, "violates PodSecurity")

	// An unknown field in a custom resource: its schema refuses it.
	kinds := make([]string, 0, len(customs))
	for k := range customs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		o := customs[k].clone()
		spec, _ := o["spec"].(map[string]any)
		if spec == nil {
			spec = map[string]any{}
			o["spec"] = spec
		}
		spec["paykubeUnknownField"] = true
		r, err := s.api.apply(ctx, o, testNamespace, true)
		expect(fmt.Sprintf("%s with an unknown field (spec.paykubeUnknownField)", customs[k]), r, err, "paykubeUnknownField")
	}
}

// container is the first container of a workload's pod template.
func container(o object) map[string]any {
	spec := o["spec"].(map[string]any)
	tmpl := spec["template"].(map[string]any)
	ps := tmpl["spec"].(map[string]any)
	return ps["containers"].([]any)[0].(map[string]any)
}

// builtinGroups are the API groups kube-apiserver serves itself (those of
// the objects paysvc ships, and their neighbours).
var builtinGroups = map[string]struct{}{
	"": {}, "apps": {}, "batch": {}, "policy": {}, "networking.k8s.io": {}, "autoscaling": {},
	"rbac.authorization.k8s.io": {}, "apiextensions.k8s.io": {}, "scheduling.k8s.io": {},
	"storage.k8s.io": {}, "coordination.k8s.io": {}, "discovery.k8s.io": {},
	"admissionregistration.k8s.io": {}, "certificates.k8s.io": {}, "node.k8s.io": {},
}

func groupOf(apiVersion string) string {
	g, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return g
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
