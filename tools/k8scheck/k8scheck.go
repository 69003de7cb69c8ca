// Package k8scheck builds paysvc's Kubernetes manifests (deploy/k8s) with
// kustomize's own Go API, decodes every object strictly into the
// Kubernetes API types (k8s.io/api, and the prometheus-operator's for
// PrometheusRule and ServiceMonitor), and checks the policies the
// manifests promise: non-root, read-only root, probes decided, resources,
// each container reading only its own credentials, the NetworkPolicies.
//
// It lives in the tools module so that kustomize and k8s.io/api stay out
// of the daemon's dependencies.
package k8scheck

import (
	"errors"
	"fmt"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Object is one built object, decoded into its API type (a pointer:
// *appsv1.Deployment, *corev1.Service, ...).
type Object struct {
	APIVersion, Kind, Name string
	Typed                  any
}

// types are the kinds the manifests may hold, each with its API type. A
// kind missing here (or a misspelled apiVersion or kind) is refused: the
// checks below would otherwise pass over it.
var types = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return new(appsv1.Deployment) },
	"batch/v1/CronJob":                        func() any { return new(batchv1.CronJob) },
	"v1/Service":                              func() any { return new(corev1.Service) },
	"v1/ConfigMap":                            func() any { return new(corev1.ConfigMap) },
	"v1/Secret":                               func() any { return new(corev1.Secret) },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return new(networkingv1.NetworkPolicy) },
	"policy/v1/PodDisruptionBudget":           func() any { return new(policyv1.PodDisruptionBudget) },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return new(monitoringv1.PrometheusRule) },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return new(monitoringv1.ServiceMonitor) },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return new(monitoringv1.PodMonitor) },
}

// Decode decodes one object's JSON into its API type, strictly: a field
// the type does not have, or a duplicate one, is an error. The matching is
// case-sensitive (sigs.k8s.io/json, as the API server decodes):
// encoding/json would take readOnlyRootFileSystem for
// readOnlyRootFilesystem, and a server would then drop it.
func Decode(raw []byte) (Object, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &meta); err != nil {
		return Object{}, err
	}
	o := Object{APIVersion: meta.APIVersion, Kind: meta.Kind, Name: meta.Metadata.Name}
	newT := types[meta.APIVersion+"/"+meta.Kind]
	if newT == nil {
		return o, fmt.Errorf("%s %s: apiVersion/kind %s/%s is not one the manifests use (misspelled?)", meta.Kind, meta.Metadata.Name, meta.APIVersion, meta.Kind)
	}
	o.Typed = newT()
	strict, err := sigsjson.UnmarshalStrict(raw, o.Typed)
	if err != nil {
		return o, fmt.Errorf("%s %s: %w", o.Kind, o.Name, err)
	}
	if len(strict) > 0 {
		return o, fmt.Errorf("%s %s: %w", o.Kind, o.Name, errors.Join(strict...))
	}
	return o, nil
}

// Build runs kustomize on dir (an overlay, or the base) of fsys, as
// kubectl apply -k and kustomize build do, and decodes every object.
func Build(fsys filesys.FileSystem, dir string) ([]Object, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []Object
	var errs []error
	for _, r := range m.Resources() {
		raw, err := r.MarshalJSON()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		o, err := Decode(raw)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return objs, errors.Join(errs...)
}

// Options say what an overlay must hold beyond what every one does.
type Options struct {
	// MinReplicas for the Deployment paysvc.
	MinReplicas int32
	// PinnedImage: the image names a registry and a release tag (not
	// dev, not latest).
	PinnedImage bool
}

// problems collects the policy violations.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// workload is one pod template and where it comes from.
type workload struct {
	name   string
	labels map[string]string
	pod    *corev1.PodSpec
}

// Check applies the policies to a built overlay; it returns one line per
// violation.
func Check(objs []Object, o Options) []string {
	var p problems
	var dep *appsv1.Deployment
	var cron *batchv1.CronJob
	var svc *corev1.Service
	var pdb *policyv1.PodDisruptionBudget
	var policies []*networkingv1.NetworkPolicy
	var monitors []*monitoringv1.ServiceMonitor
	configMaps := map[string]bool{}
	for _, obj := range objs {
		for _, msg := range validation.IsDNS1123Subdomain(obj.Name) {
			p.add("%s %q: %s", obj.Kind, obj.Name, msg)
		}
		switch t := obj.Typed.(type) {
		case *appsv1.Deployment:
			dep = t
		case *batchv1.CronJob:
			cron = t
		case *corev1.Service:
			svc = t
		case *policyv1.PodDisruptionBudget:
			pdb = t
		case *networkingv1.NetworkPolicy:
			policies = append(policies, t)
		case *monitoringv1.ServiceMonitor:
			monitors = append(monitors, t)
		case *corev1.ConfigMap:
			configMaps[t.Name] = true
		}
	}
	if dep == nil || cron == nil || svc == nil || pdb == nil {
		p.add("want a Deployment, a CronJob, a Service and a PodDisruptionBudget; have %v %v %v %v", dep != nil, cron != nil, svc != nil, pdb != nil)
		return p
	}
	daemon := workload{"Deployment " + dep.Name, dep.Spec.Template.Labels, &dep.Spec.Template.Spec}
	prune := workload{"CronJob " + cron.Name, cron.Spec.JobTemplate.Spec.Template.Labels, &cron.Spec.JobTemplate.Spec.Template.Spec}
	workloads := []workload{daemon, prune}

	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < o.MinReplicas {
		n := "unset"
		if dep.Spec.Replicas != nil {
			n = fmt.Sprint(*dep.Spec.Replicas)
		}
		p.add("Deployment %s: replicas %s, want at least %d (set in the overlay)", dep.Name, n, o.MinReplicas)
	}
	for _, w := range workloads {
		checkPod(&p, w, configMaps, o)
	}
	checkDaemon(&p, daemon)
	checkSecrets(&p, workloads)
	checkSelectors(&p, daemon, prune, dep, svc, pdb)
	checkNetworkPolicies(&p, daemon, prune, policies)
	for _, m := range monitors {
		if !selects(&m.Spec.Selector, svc.Labels) {
			p.add("ServiceMonitor %s does not select the Service %s (labels %v)", m.Name, svc.Name, svc.Labels)
		}
		for _, e := range m.Spec.Endpoints {
			if !hasServicePort(svc, e.Port) || e.Path != "/metrics" {
				p.add("ServiceMonitor %s: endpoint port %q path %q, want a port of the Service and /metrics", m.Name, e.Port, e.Path)
			}
		}
	}
	return p
}

func checkPod(p *problems, w workload, configMaps map[string]bool, o Options) {
	pod := w.pod
	sc := pod.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		p.add("%s: the pod must run as a non-root uid (runAsNonRoot, runAsUser)", w.name)
	} else if sc.FSGroup == nil || sc.RunAsGroup == nil || *sc.FSGroup != *sc.RunAsGroup {
		p.add("%s: fsGroup must be the runAsGroup, or the mounted Secrets stay root's", w.name)
	}
	if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add("%s: want seccompProfile RuntimeDefault", w.name)
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		p.add("%s: enableServiceLinks must be false (paysvc refuses the PAYSVC_* Service variables)", w.name)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		p.add("%s: automountServiceAccountToken must be false (paysvc does not talk to the API server)", w.name)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
		if v.ConfigMap != nil && !configMaps[v.ConfigMap.Name] {
			p.add("%s: volume %s names ConfigMap %s, which the build does not hold (a generator name not rewritten?)", w.name, v.Name, v.ConfigMap.Name)
		}
		if v.Secret != nil && v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o040 == 0 {
			p.add("%s: volume %s: defaultMode %#o gives the fsGroup no read", w.name, v.Name, *v.Secret.DefaultMode)
		}
	}
	for _, c := range allContainers(pod) {
		cs := c.SecurityContext
		if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
			cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
			cs.Capabilities == nil || len(cs.Capabilities.Drop) != 1 || cs.Capabilities.Drop[0] != "ALL" {
			p.add("%s: container %s: want a read-only root, no privilege escalation, all capabilities dropped", w.name, c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if !hasReq || !hasLim {
				p.add("%s: container %s: no %s request or limit", w.name, c.Name, r)
			} else if req.Cmp(lim) > 0 {
				p.add("%s: container %s: %s request %s above its limit %s", w.name, c.Name, r, req.String(), lim.String())
			}
		}
		for _, e := range c.Env {
			if e.Name == "GOMEMLIMIT" {
				p.add("%s: container %s sets GOMEMLIMIT: paysvc sets it to 90%% of its cgroup's memory limit", w.name, c.Name)
			}
		}
		for _, m := range c.VolumeMounts {
			if _, ok := vols[m.Name]; !ok {
				p.add("%s: container %s mounts volume %s, which the pod does not have", w.name, c.Name, m.Name)
			}
		}
		for _, port := range c.Ports {
			for _, msg := range validation.IsValidPortName(port.Name) {
				p.add("%s: container %s port %q: %s", w.name, c.Name, port.Name, msg)
			}
		}
		name, tag := splitImage(c.Image)
		if c.Image == "" || tag == "latest" || tag == "" && !strings.Contains(c.Image, "@sha256:") {
			p.add("%s: container %s: image %q has no version (set it in the overlay)", w.name, c.Name, c.Image)
		}
		if o.PinnedImage && (!strings.Contains(name, "/") || strings.Contains(tag, "dev")) {
			p.add("%s: container %s: image %q is not a release from a registry", w.name, c.Name, c.Image)
		}
	}
}

func splitImage(image string) (name, tag string) {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	slash := strings.LastIndex(image, "/")
	if i := strings.LastIndex(image, ":"); i > slash {
		return image[:i], image[i+1:]
	}
	return image, ""
}

func allContainers(pod *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range pod.InitContainers {
		out = append(out, &pod.InitContainers[i])
	}
	for i := range pod.Containers {
		out = append(out, &pod.Containers[i])
	}
	return out
}

// checkDaemon: the paysvc container's probes and listeners.
func checkDaemon(p *problems, w workload) {
	var c *corev1.Container
	for i := range w.pod.Containers {
		if w.pod.Containers[i].Name == "paysvc" {
			c = &w.pod.Containers[i]
		}
	}
	if c == nil {
		p.add("%s: no container paysvc", w.name)
		return
	}
	ports := map[string]int32{}
	for _, port := range c.Ports {
		ports[port.Name] = port.ContainerPort
	}
	if ports["http"] != 8080 || ports["admin"] != 8081 {
		p.add("%s: want ports http 8080 (http.addr) and admin 8081 (admin.addr): %v", w.name, ports)
	}
	// Decoded without the API server's defaults, a field left out is 0:
	// the server would make timeoutSeconds 1, periodSeconds 10,
	// failureThreshold 3.
	for name, probe := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
		switch {
		case probe == nil || probe.HTTPGet == nil:
			p.add("%s: %s: want an HTTP probe", w.name, name)
		case probe.TimeoutSeconds == 0 || probe.PeriodSeconds == 0 || probe.FailureThreshold == 0:
			p.add("%s: %s: timeoutSeconds %d, periodSeconds %d, failureThreshold %d: set each (the API server's default decides what is left out)",
				w.name, name, probe.TimeoutSeconds, probe.PeriodSeconds, probe.FailureThreshold)
		case probe.HTTPGet.Port.StrVal != "http":
			p.add("%s: %s on port %s, want the http port (http.addr)", w.name, name, probe.HTTPGet.Port.String())
		case probe.TimeoutSeconds >= probe.PeriodSeconds && name != "startupProbe":
			p.add("%s: %s: timeoutSeconds %d not below periodSeconds %d", w.name, name, probe.TimeoutSeconds, probe.PeriodSeconds)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/healthz" {
		p.add("%s: livenessProbe on %s, want /healthz (it answers before any dependency: an outage never restarts a pod)", w.name, c.LivenessProbe.HTTPGet.Path)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		p.add("%s: readinessProbe on %s, want /readyz", w.name, c.ReadinessProbe.HTTPGet.Path)
	}
	if lim := c.Resources.Limits[corev1.ResourceCPU]; lim.String() != "1" {
		p.add("%s: container paysvc: CPU limit %s, want 1 (paysvc runs on one CPU)", w.name, lim.String())
	}
}

// source is what a container can read of a Secret: one key, or all of it ("").
type source struct{ secret, key string }

// readable lists what of the Secrets c can read: the Secret volumes (and
// projected ones) it mounts, with their items, and its environment.
func readable(pod *corev1.PodSpec, c *corev1.Container) []source {
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	var out []source
	fromItems := func(name string, items []corev1.KeyToPath) {
		if len(items) == 0 {
			out = append(out, source{name, ""})
		}
		for _, it := range items {
			out = append(out, source{name, it.Key})
		}
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		if v.Secret != nil {
			fromItems(v.Secret.SecretName, v.Secret.Items)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					fromItems(s.Secret.Name, s.Secret.Items)
				}
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			out = append(out, source{e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key})
		}
	}
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil {
			out = append(out, source{e.SecretRef.Name, ""})
		}
	}
	return out
}

// dsnSource resolves the container's PAYSVC_MYSQL_DSN_FILE to the Secret
// key behind it: the mount holding the file, its volume, the item (or the
// key of the same name).
func dsnSource(pod *corev1.PodSpec, c *corev1.Container) (source, error) {
	file := ""
	for _, e := range c.Env {
		if e.Name == "PAYSVC_MYSQL_DSN_FILE" {
			file = e.Value
		}
		if e.Name == "PAYSVC_MYSQL_DSN" {
			return source{}, fmt.Errorf("container %s takes its DSN in PAYSVC_MYSQL_DSN: use PAYSVC_MYSQL_DSN_FILE", c.Name)
		}
	}
	if file == "" {
		return source{}, fmt.Errorf("container %s has no PAYSVC_MYSQL_DSN_FILE", c.Name)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		v := vols[m.Name]
		if v.Secret == nil {
			return source{}, fmt.Errorf("container %s: %s is on volume %s, not a Secret", c.Name, file, m.Name)
		}
		if len(v.Secret.Items) == 0 {
			return source{v.Secret.SecretName, rel}, nil
		}
		for _, it := range v.Secret.Items {
			if it.Path == rel {
				return source{v.Secret.SecretName, it.Key}, nil
			}
		}
		return source{}, fmt.Errorf("container %s: %s: volume %s has no item at %s", c.Name, file, m.Name, rel)
	}
	return source{}, fmt.Errorf("container %s: no volume mounted at %s", c.Name, file)
}

// checkSecrets: each MySQL user's DSN (the daemon's, the migration user's,
// the prune user's) is readable by its own container only. The migration
// user may alter the schema: the daemon, which faces the broker's input,
// must not be able to read it.
func checkSecrets(p *problems, workloads []workload) {
	type holder struct {
		where string
		pod   *corev1.PodSpec
		c     *corev1.Container
		dsn   source
	}
	var holders []holder
	var all []holder
	for _, w := range workloads {
		for _, c := range allContainers(w.pod) {
			h := holder{w.name + " container " + c.Name, w.pod, c, source{}}
			all = append(all, h)
			dsn, err := dsnSource(w.pod, c)
			if err != nil {
				p.add("%s: %v", w.name, err)
				continue
			}
			h.dsn = dsn
			holders = append(holders, h)
		}
	}
	for i, a := range holders {
		for _, b := range holders[i+1:] {
			if a.dsn == b.dsn {
				p.add("%s and %s use the same DSN (Secret %s key %s): each needs its own user", a.where, b.where, a.dsn.secret, a.dsn.key)
			}
		}
	}
	for _, owner := range holders {
		for _, other := range all {
			if other.c == owner.c {
				continue
			}
			for _, s := range readable(other.pod, other.c) {
				if s.secret == owner.dsn.secret && (s.key == "" || s.key == owner.dsn.key) {
					p.add("%s can read %s's DSN (Secret %s key %s)", other.where, owner.where, s.secret, owner.dsn.key)
				}
			}
		}
	}
}

func selects(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil || len(sel.MatchExpressions) > 0 || len(sel.MatchLabels) == 0 {
		return false // only the plain form is used here
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func selectsMap(sel map[string]string, labels map[string]string) bool {
	return selects(&metav1.LabelSelector{MatchLabels: sel}, labels)
}

func hasServicePort(svc *corev1.Service, name string) bool {
	for _, sp := range svc.Spec.Ports {
		if sp.Name == name {
			return true
		}
	}
	return false
}

// checkSelectors: the Deployment, Service and PDB select the daemon's pods
// and not the prune job's; the Service's ports reach the listeners.
func checkSelectors(p *problems, daemon, prune workload, dep *appsv1.Deployment, svc *corev1.Service, pdb *policyv1.PodDisruptionBudget) {
	for what, ok := range map[string][2]bool{
		"Deployment " + dep.Name:          {selects(dep.Spec.Selector, daemon.labels), selects(dep.Spec.Selector, prune.labels)},
		"Service " + svc.Name:             {selectsMap(svc.Spec.Selector, daemon.labels), selectsMap(svc.Spec.Selector, prune.labels)},
		"PodDisruptionBudget " + pdb.Name: {selects(pdb.Spec.Selector, daemon.labels), selects(pdb.Spec.Selector, prune.labels)},
	} {
		if !ok[0] || ok[1] {
			p.add("%s must select the daemon's pods (%v: %v) and not the prune job's (%v: %v)", what, daemon.labels, ok[0], prune.labels, ok[1])
		}
	}
	want := map[string]int32{"http": 8080, "admin": 8081}
	for _, sp := range svc.Spec.Ports {
		if want[sp.Name] != sp.Port || sp.TargetPort.StrVal != sp.Name {
			p.add("Service %s: port %s %d → %s, want http 8080 and admin 8081 to the container's ports of those names", svc.Name, sp.Name, sp.Port, sp.TargetPort.String())
		}
		delete(want, sp.Name)
	}
	if len(want) > 0 {
		p.add("Service %s: no port %v", svc.Name, want)
	}
}

// peersAre: every peer of the rule is a namespace selector with exactly
// these labels (no pod-only selector, which means the policy's own
// namespace, no IP block).
func peersAre(peers []networkingv1.NetworkPolicyPeer, labels map[string]string) bool {
	if len(peers) == 0 {
		return false // no from: every source
	}
	for _, peer := range peers {
		if peer.IPBlock != nil || peer.PodSelector != nil || peer.NamespaceSelector == nil ||
			len(peer.NamespaceSelector.MatchExpressions) > 0 || len(peer.NamespaceSelector.MatchLabels) != len(labels) {
			return false
		}
		for k, v := range labels {
			if peer.NamespaceSelector.MatchLabels[k] != v {
				return false
			}
		}
	}
	return true
}

type portProto struct {
	port  int32
	proto corev1.Protocol
}

func rulePorts(ports []networkingv1.NetworkPolicyPort) []portProto {
	var out []portProto
	for _, pp := range ports {
		proto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			proto = *pp.Protocol
		}
		n := int32(0)
		if pp.Port != nil {
			n = pp.Port.IntVal
		}
		out = append(out, portProto{n, proto})
	}
	return out
}

func checkNetworkPolicies(p *problems, daemon, prune workload, policies []*networkingv1.NetworkPolicy) {
	var forDaemon, forPrune []*networkingv1.NetworkPolicy
	for _, np := range policies {
		if selects(&np.Spec.PodSelector, daemon.labels) {
			forDaemon = append(forDaemon, np)
		}
		if selects(&np.Spec.PodSelector, prune.labels) {
			forPrune = append(forPrune, np)
		}
	}
	if len(forDaemon) != 1 || len(forPrune) != 1 {
		p.add("want one NetworkPolicy for the daemon's pods and one for the prune job's: %d, %d", len(forDaemon), len(forPrune))
		return
	}
	for _, np := range []*networkingv1.NetworkPolicy{forDaemon[0], forPrune[0]} {
		types := fmt.Sprint(np.Spec.PolicyTypes)
		if !strings.Contains(types, "Ingress") || !strings.Contains(types, "Egress") {
			p.add("NetworkPolicy %s: policyTypes %s, want Ingress and Egress", np.Name, types)
		}
	}
	// The daemon: 8080 from the namespace monitoring only, 8081 from the
	// operators' namespaces only, nothing else.
	allowed := map[int32]map[string]string{
		8080: {"kubernetes.io/metadata.name": "monitoring"},
		8081: {"paysvc.io/admin": "allowed"},
	}
	seen := map[int32]bool{}
	for _, rule := range forDaemon[0].Spec.Ingress {
		ports := rulePorts(rule.Ports)
		if len(ports) == 0 {
			p.add("NetworkPolicy %s: an ingress rule without ports lets in every port", forDaemon[0].Name)
		}
		for _, pp := range ports {
			want, ok := allowed[pp.port]
			switch {
			case !ok || pp.proto != corev1.ProtocolTCP:
				p.add("NetworkPolicy %s: ingress to %d/%s, which paysvc does not serve", forDaemon[0].Name, pp.port, pp.proto)
			case !peersAre(rule.From, want):
				p.add("NetworkPolicy %s: ingress to %d from %v, want only namespaces labelled %v", forDaemon[0].Name, pp.port, rule.From, want)
			}
			seen[pp.port] = true
		}
	}
	if !seen[8080] || !seen[8081] {
		p.add("NetworkPolicy %s: want ingress rules for 8080 (scrapes) and 8081 (operators)", forDaemon[0].Name)
	}
	egress := map[portProto]bool{}
	for _, rule := range forDaemon[0].Spec.Egress {
		for _, pp := range rulePorts(rule.Ports) {
			egress[pp] = true
		}
	}
	for _, want := range []portProto{{53, corev1.ProtocolUDP}, {3306, corev1.ProtocolTCP}, {5672, corev1.ProtocolTCP}, {6379, corev1.ProtocolTCP},
		{4317, corev1.ProtocolTCP}, {4318, corev1.ProtocolTCP}} {
		if !egress[want] {
			p.add("NetworkPolicy %s: no egress to %d/%s", forDaemon[0].Name, want.port, want.proto)
		}
	}
	// The prune job: nothing in, DNS and MySQL out.
	np := forPrune[0]
	if len(np.Spec.Ingress) > 0 {
		p.add("NetworkPolicy %s: the prune job serves nothing: want no ingress rule", np.Name)
	}
	for _, rule := range np.Spec.Egress {
		ports := rulePorts(rule.Ports)
		if len(ports) == 0 {
			p.add("NetworkPolicy %s: an egress rule without ports lets out every port", np.Name)
		}
		for _, pp := range ports {
			if pp.port != 53 && pp != (portProto{3306, corev1.ProtocolTCP}) {
				p.add("NetworkPolicy %s: egress to %d/%s: the prune job talks to MySQL (and DNS) only", np.Name, pp.port, pp.proto)
			}
		}
	}
}
