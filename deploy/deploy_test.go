// Package deploy holds the container and orchestration files; its tests
// parse and check them (no Docker engine or cluster runs here) and build the
// binary the way the Dockerfile does.
package deploy

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var out []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			out = append(out, d)
		}
	}
}

// get walks a decoded YAML tree: get(doc, "spec", "template", 0, "name").
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			s, ok := v.([]any)
			if !ok || k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}

// knownEnv lists PAYSVC_<SECTION>_<KEY> (and _FILE) for every key of the
// repository's config.yaml.
func knownEnv(t *testing.T) map[string]bool {
	t.Helper()
	var cfg map[string]map[string]any
	b, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for section, keys := range cfg {
		for key := range keys {
			name := "PAYSVC_" + strings.ToUpper(section+"_"+key)
			known[name], known[name+"_FILE"] = true, true
		}
	}
	return known
}

func drainTimeout(t *testing.T) time.Duration {
	var cfg struct {
		AMQP struct {
			DrainTimeout string `yaml:"drainTimeout"`
		} `yaml:"amqp"`
	}
	b, _ := os.ReadFile("../config.yaml")
	yaml.Unmarshal(b, &cfg)
	d, err := time.ParseDuration(cfg.AMQP.DrainTimeout)
	if err != nil {
		t.Fatalf("config.yaml amqp.drainTimeout: %v", err)
	}
	return d
}

// serviceLinkEnv is the names of the variables the kubelet gives a
// container for a Service of its namespace when service links are on
// (Docker links' convention: NAME_SERVICE_HOST, NAME_PORT_8080_TCP_ADDR, ...).
func serviceLinkEnv(svc map[string]any) []string {
	name, _ := get(svc, "metadata", "name").(string)
	p := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	out := []string{p + "_SERVICE_HOST", p + "_SERVICE_PORT", p + "_PORT"}
	ports, _ := get(svc, "spec", "ports").([]any)
	for _, port := range ports {
		proto, _ := get(port, "protocol").(string)
		if proto == "" {
			proto = "TCP"
		}
		if n, ok := get(port, "name").(string); ok {
			out = append(out, p+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(n, "-", "_")))
		}
		base := fmt.Sprintf("%s_PORT_%v_%s", p, get(port, "port"), proto)
		out = append(out, base, base+"_PROTO", base+"_PORT", base+"_ADDR")
	}
	return out
}

// TestKubernetesManifests reads the base's files as written (the overlays,
// built by kustomize and decoded into Kubernetes' own types, are checked by
// tools/k8scheck).
func TestKubernetesManifests(t *testing.T) {
	known := knownEnv(t)
	kinds := map[string]map[string]any{}
	var services []map[string]any
	files, _ := filepath.Glob("k8s/base/*.yaml")
	for _, f := range files {
		if f == filepath.Join("k8s", "base", "config.yaml") {
			continue // the generated ConfigMap's content, not a manifest
		}
		for _, d := range docs(t, f) {
			if d["apiVersion"] == nil || d["kind"] == nil || (d["kind"] != "Kustomization" && get(d, "metadata", "name") == nil) {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			if k, _ := d["kind"].(string); k != "Kustomization" {
				kinds[k] = d
			}
			if d["kind"] == "Service" {
				services = append(services, d)
			}
		}
	}
	for _, k := range []string{"Deployment", "PodDisruptionBudget", "NetworkPolicy", "Service", "CronJob"} {
		if kinds[k] == nil {
			t.Errorf("no %s manifest", k)
		}
	}
	dep := kinds["Deployment"]
	pod := get(dep, "spec", "template", "spec")
	prunePod := get(kinds["CronJob"], "spec", "jobTemplate", "spec", "template", "spec")
	for name, pod := range map[string]any{"deployment": pod, "prune cronjob": prunePod} {
		// Unless enableServiceLinks is false, the kubelet gives every
		// container variables for each Service of its namespace, and paysvc
		// refuses an unknown PAYSVC_* variable: the Service paysvc alone
		// (PAYSVC_SERVICE_HOST, ...) would stop every pod at start-up.
		if get(pod, "enableServiceLinks") != false {
			for _, svc := range services {
				for _, env := range serviceLinkEnv(svc) {
					if strings.HasPrefix(env, "PAYSVC_") && !known[env] {
						t.Errorf("%s: the kubelet would give the pod %s (Service %v), which paysvc refuses: set enableServiceLinks: false",
							name, env, get(svc, "metadata", "name"))
					}
				}
			}
		}
		// The Secret's files must be readable by the pod's user: the kubelet
		// leaves them root's unless fsGroup names the user's group, and then
		// gives that group read (TestSecretFilesReadableAsTheKubeletMountsThem
		// in cmd/paysvc runs paysvc against both results).
		if fs, gid := get(pod, "securityContext", "fsGroup"), get(pod, "securityContext", "runAsGroup"); fs == nil || fs != gid {
			t.Errorf("%s: pod fsGroup %v, want the runAsGroup %v: the mounted Secret is unreadable otherwise", name, fs, gid)
		}
		vols, _ := get(pod, "volumes").([]any)
		for _, v := range vols {
			if mode, ok := get(v, "secret", "defaultMode").(int); ok && mode&0o040 == 0 {
				t.Errorf("%s: volume %v: defaultMode %#o gives the group no read", name, get(v, "name"), mode)
			}
		}
		mounted := false
		for _, v := range vols {
			if get(v, "configMap", "name") == "paysvc-config" {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("%s: the pod does not mount the generated ConfigMap paysvc-config", name)
		}
		containers, _ := get(pod, "containers").([]any)
		inits, _ := get(pod, "initContainers").([]any)
		for _, c := range append(containers, inits...) {
			if get(c, "securityContext", "readOnlyRootFilesystem") != true || get(c, "securityContext", "allowPrivilegeEscalation") != false ||
				get(c, "securityContext", "capabilities", "drop", 0) != "ALL" || get(pod, "securityContext", "runAsNonRoot") != true {
				t.Errorf("%s: container %v security: %v / pod %v", name, get(c, "name"), get(c, "securityContext"), get(pod, "securityContext"))
			}
			envs, _ := get(c, "env").([]any)
			for _, e := range envs {
				env, _ := get(e, "name").(string)
				if strings.HasPrefix(env, "PAYSVC_") && !known[env] {
					t.Errorf("%s sets %s, which paysvc does not know (it would refuse to start)", name, env)
				}
				if v, _ := get(e, "value").(string); inlineSecret.MatchString(v) {
					t.Errorf("%s env %s holds what looks like a secret: use the Secret", name, env)
				}
				// paysvc sets GOMEMLIMIT to 90% of its cgroup's memory limit
				// itself; the variable would override it with the whole limit.
				if env == "GOMEMLIMIT" {
					t.Errorf("%s: container %v sets GOMEMLIMIT: paysvc derives it from the cgroup limit", name, get(c, "name"))
				}
			}
		}
	}
	c := get(pod, "containers", 0)
	grace, _ := get(pod, "terminationGracePeriodSeconds").(int)
	preStop, _ := get(c, "lifecycle", "preStop", "sleep", "seconds").(int)
	// Every bounded wait on the drain path after amqp.drainTimeout: stop
	// intake, workers after the timeout, held acks, the unstarted
	// messages' nack, channel and connection close, the copies' connection
	// close (5 s each, internal/listener; broker.CloseConn), the admin
	// publisher's close
	// (broker.CloseTimeout), the helpers (the dispatcher's notice batch: 10 s
	// confirm wait + 10 s mark + its connection's close 5 s,
	// internal/outbox), the spans' last export (5 s, internal/tracing), the
	// HTTP server (5 s).
	const afterDrain = 7*5*time.Second + 5*time.Second + 25*time.Second + 5*time.Second + 5*time.Second
	if need := time.Duration(preStop)*time.Second + drainTimeout(t) + afterDrain; time.Duration(grace)*time.Second < need || preStop == 0 {
		t.Errorf("terminationGracePeriodSeconds %d must cover preStop %ds + drain timeout %s + the bounded waits after it (%s): %s",
			grace, preStop, drainTimeout(t), afterDrain, need)
	}
	if get(pod, "topologySpreadConstraints", 0, "topologyKey") != "kubernetes.io/hostname" {
		t.Errorf("want replicas spread across nodes: %v", get(pod, "topologySpreadConstraints"))
	}
	// A hard spread counts, by default, nodes the pod cannot use (tainted,
	// cordoned) as empty ones: with two workers and a tainted control
	// plane the third replica would stay Pending.
	spread, _ := get(pod, "topologySpreadConstraints").([]any)
	for _, c := range spread {
		if get(c, "whenUnsatisfiable") == "DoNotSchedule" && get(c, "nodeTaintsPolicy") != "Honor" {
			t.Errorf("spread over %v: DoNotSchedule without nodeTaintsPolicy: Honor", get(c, "topologyKey"))
		}
	}
	init := get(pod, "initContainers", 0)
	if get(init, "args", 0) != "migrate" || get(init, "env", 0, "value") != "/run/secrets/paysvc-migrate/mysql_dsn" {
		t.Errorf("want an init container running migrate with the migration user: %v", init)
	}
	prune := get(prunePod, "containers", 0)
	if fmt.Sprint(get(prune, "args")) != "[prune --config /etc/paysvc/config.yaml]" || get(prune, "env", 0, "value") != "/run/secrets/paysvc-prune/mysql_dsn" {
		t.Errorf("want the CronJob running paysvc prune --config /etc/paysvc/config.yaml with the prune user: %v", prune)
	}
	if get(kinds["CronJob"], "spec", "concurrencyPolicy") != "Forbid" {
		t.Error("the prune CronJob must not start a run while one goes on (concurrencyPolicy: Forbid)")
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"} {
		if get(c, probe, "httpGet", "path") != path || get(c, probe, "httpGet", "port") != "http" {
			t.Errorf("%s: want GET %s on the http port, got %v", probe, path, get(c, probe))
		}
		// The API server fills timeoutSeconds: 1 and the others when left
		// out: the manifest decides each.
		for _, f := range []string{"timeoutSeconds", "periodSeconds", "failureThreshold"} {
			if _, ok := get(c, probe, f).(int); !ok {
				t.Errorf("%s: %s not set: the API server's default decides it", probe, f)
			}
		}
	}
	if get(c, "ports", 0, "containerPort") != 8080 || get(c, "ports", 0, "name") != "http" ||
		get(c, "ports", 1, "containerPort") != 8081 || get(c, "ports", 1, "name") != "admin" {
		t.Errorf("ports: want http 8080 (http.addr) and admin 8081 (admin.addr): %v", get(c, "ports"))
	}
	addrs := map[string]any{}
	envs, _ := get(c, "env").([]any)
	for _, e := range envs {
		addrs[fmt.Sprint(get(e, "name"))] = get(e, "value")
	}
	if addrs["PAYSVC_HTTP_ADDR"] != "0.0.0.0:8080" || addrs["PAYSVC_ADMIN_ADDR"] != ":8081" {
		t.Errorf("want http.addr on 8080 and admin.addr on 8081, on every interface: %v, %v", addrs["PAYSVC_HTTP_ADDR"], addrs["PAYSVC_ADMIN_ADDR"])
	}
	// The configuration is a generated ConfigMap (a name with its content's
	// hash): a plain one is replaced in place by the next apply, under the
	// pods of the previous ReplicaSet, whose binary refuses keys it does
	// not know (a restart mid-rollout or a rollback would not start).
	if kinds["ConfigMap"] != nil {
		t.Error("a plain ConfigMap in k8s/base: generate it (configMapGenerator) so that each ReplicaSet keeps its own")
	}
	kust := docs(t, "k8s/base/kustomization.yaml")[0]
	gen, _ := get(kust, "configMapGenerator").([]any)
	generated := false
	for _, g := range gen {
		files, _ := get(g, "files").([]any)
		if get(g, "name") == "paysvc-config" && len(files) == 1 && files[0] == "config.yaml" {
			generated = true
		}
	}
	if !generated || get(kust, "generatorOptions", "disableNameSuffixHash") == true {
		t.Error("kustomization: want configMapGenerator paysvc-config from config.yaml, with its hash suffix")
	}
	cm, _ := os.ReadFile("k8s/base/config.yaml")
	repo, _ := os.ReadFile("../config.yaml")
	if len(cm) == 0 || string(cm) != string(repo) {
		t.Error("k8s/base/config.yaml differs from the repository's config.yaml (make docs)")
	}
	if get(kinds["PodDisruptionBudget"], "spec", "maxUnavailable") != 1 {
		t.Error("the PodDisruptionBudget should allow one replica down at a time")
	}
	if get(kinds["PodDisruptionBudget"], "spec", "unhealthyPodEvictionPolicy") != "AlwaysAllow" {
		t.Error("the PodDisruptionBudget must let unready pods go (an outage must not block node drains)")
	}
	if kinds["Job"] != nil {
		t.Error("a Job in the kustomization: its template is immutable, and the next apply with a new image fails")
	}
	for _, r := range get(kust, "resources").([]any) {
		if _, err := os.Stat(filepath.Join("k8s", "base", r.(string))); err != nil {
			t.Errorf("kustomization lists %s: %v", r, err)
		}
	}
}

// The example Secrets and the dev overlay's generated ones hold
// placeholders only, and production's Secrets are not in its overlay.
func TestKubernetesSecretsArePlaceholders(t *testing.T) {
	n := 0
	for _, d := range docs(t, "k8s/overlays/production/secrets.example.yaml") {
		data, _ := get(d, "stringData").(map[string]any)
		for k, v := range data {
			n++
			if !strings.Contains(v.(string), "CHANGE-ME") {
				t.Errorf("secrets.example.yaml %v %s holds a real-looking value", get(d, "metadata", "name"), k)
			}
		}
	}
	envs, _ := filepath.Glob("k8s/overlays/dev/*.env")
	for _, f := range envs {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			n++
			if k, v, _ := strings.Cut(line, "="); !strings.Contains(v, "CHANGE-ME") {
				t.Errorf("%s: %s holds a real-looking value", f, k)
			}
		}
	}
	if n == 0 || len(envs) == 0 {
		t.Error("no example Secret values found")
	}
	prod := docs(t, "k8s/overlays/production/kustomization.yaml")[0]
	for _, r := range get(prod, "resources").([]any) {
		if strings.Contains(r.(string), "secret") {
			t.Errorf("the production overlay lists %s: its Secrets are created out of band", r)
		}
	}
	if prod["secretGenerator"] != nil {
		t.Error("the production overlay generates Secrets: they are created out of band")
	}
}

// The production overlay names the release this tree becomes: the
// manifests use its keys, which an older binary refuses.
func TestKubernetesProductionImageIsTheRelease(t *testing.T) {
	v, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	release := regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+`).FindString(strings.TrimSpace(string(v)))
	prod := docs(t, "k8s/overlays/production/kustomization.yaml")[0]
	if tag := get(prod, "images", 0, "newTag"); get(prod, "images", 0, "name") != "paysvc" || tag != release {
		t.Errorf("overlays/production: image paysvc tag %v, want the release %q (VERSION %s)", tag, release, strings.TrimSpace(string(v)))
	}
}

// readOnlyServicesTakeFileSecrets checks what Compose can create: it
// writes a secret or config sourced from an environment variable or inline
// content into the container when it creates it, so a read_only service
// may take only file-sourced ones (Compose v2.33.1 and later refuse such a
// service: "cannot create secret ... in read-only service ...: `file` is
// the sole supported option"; older ones fail at the Docker daemon).
func readOnlyServicesTakeFileSecrets(t *testing.T, file string, d map[string]any) {
	t.Helper()
	services, _ := d["services"].(map[string]any)
	for name, svc := range services {
		if get(svc, "read_only") != true {
			continue
		}
		for _, kind := range []string{"secrets", "configs"} {
			refs, _ := get(svc, kind).([]any)
			for _, ref := range refs {
				source, _ := ref.(string)
				if source == "" {
					source, _ = get(ref, "source").(string)
				}
				if get(d, kind, source, "file") == nil {
					t.Errorf("%s: service %s is read_only but takes %s %s from no file: Compose cannot create it", file, name, kind, source)
				}
			}
		}
	}
}

func TestCompose(t *testing.T) {
	known := knownEnv(t)
	d := docs(t, "compose.yaml")[0]
	readOnlyServicesTakeFileSecrets(t, "compose.yaml", d)
	services, _ := d["services"].(map[string]any)
	for _, s := range []string{"mysql", "redis", "rabbitmq", "migrate", "paysvc-1", "paysvc-2"} {
		if services[s] == nil {
			t.Errorf("no service %s", s)
		}
	}
	for _, s := range []string{"mysql", "redis", "rabbitmq"} {
		if get(services[s], "healthcheck", "test") == nil {
			t.Errorf("%s has no healthcheck", s)
		}
	}
	for _, s := range []string{"paysvc-1", "paysvc-2"} {
		for dep, cond := range map[string]string{"mysql": "service_healthy", "redis": "service_healthy",
			"rabbitmq": "service_healthy", "migrate": "service_completed_successfully"} {
			if get(services[s], "depends_on", dep, "condition") != cond {
				t.Errorf("%s: depends_on %s should wait for %s", s, dep, cond)
			}
		}
		env, _ := get(services[s], "environment").(map[string]any)
		for name := range env {
			if strings.HasPrefix(name, "PAYSVC_") && !known[name] {
				t.Errorf("%s sets %s, which paysvc does not know", s, name)
			}
		}
		if get(services[s], "cap_drop", 0) != "ALL" {
			t.Errorf("%s: want cap_drop ALL", s)
		}
		if test, _ := get(services[s], "healthcheck", "test").([]any); len(test) < 3 || test[1] != "/paysvc" || test[2] != "healthcheck" {
			t.Errorf("%s: want a healthcheck running paysvc healthcheck, got %v", s, get(services[s], "healthcheck"))
		}
		if get(services[s], "depends_on", "grants", "condition") != "service_completed_successfully" {
			t.Errorf("%s: must wait for its least-privilege user (grants)", s)
		}
		for _, secret := range []string{"PAYSVC_AMQP_URL", "PAYSVC_MYSQL_DSN", "PAYSVC_REDIS_PASSWORD", "PAYSVC_ADMIN_TOKEN"} {
			if env[secret] != nil {
				t.Errorf("%s: %s in the environment: give credentials as %s_FILE", s, secret, secret)
			}
		}
		if env["PAYSVC_MYSQL_DSN_FILE"] != "/run/secrets/mysql_dsn" || env["PAYSVC_AMQP_URL_FILE"] != "/run/secrets/amqp_url" {
			t.Errorf("%s: the DSN and broker URL must come from secret files: %v", s, env)
		}
	}
	// The migration user is not the daemon's.
	if get(services["migrate"], "environment", "PAYSVC_MYSQL_DSN_FILE") != "/run/secrets/mysql_migrate_dsn" {
		t.Errorf("migrate must use the migration user's DSN: %v", get(services["migrate"], "environment"))
	}
	if get(services["mysql"], "environment", "MYSQL_USER") != "paysvc_migrate" {
		t.Errorf("the image's all-privileges user must be the migration user, not the daemon's")
	}
	// Every image can be pinned by digest from the environment.
	for name, svc := range services {
		img, _ := get(svc, "image").(string)
		if img != "" && !regexp.MustCompile(`^\$\{[A-Z_]+_IMAGE:-[^}]+\}$|@sha256:[0-9a-f]{64}$`).MatchString(img) {
			t.Errorf("%s: image %q can be pinned neither by an *_IMAGE variable nor by digest", name, img)
		}
	}
	raw, _ := os.ReadFile("compose.yaml")
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		key := regexp.MustCompile(`^\s*[A-Za-z_]*(PASSWORD|PASS|password)\s*:\s*(\S+)`).FindStringSubmatch(line)
		// A switch (PAYSVC_ADMIN_SECURECOOKIE: "false") holds no secret.
		flag := key != nil && regexp.MustCompile(`^"?(true|false)"?$`).MatchString(key[2])
		if key != nil && !strings.HasPrefix(key[2], "${") && !flag || inlineSecret.MatchString(line) {
			t.Errorf("compose.yaml holds a literal password: %s", strings.TrimSpace(line))
		}
	}
}

// inlineSecret matches credentials written into a URL or DSN, unless they are
// an interpolation (${...}).
var inlineSecret = regexp.MustCompile(`[a-z]+://[^:/\s]+:[^@${\s]+@|^[^:\s]+:[^@${\s]+@tcp\(`)

// The Dockerfile builds a static, version-stamped binary as a non-root user
// and keeps secrets out of ARG and ENV; the same build runs here.
func TestDockerfileBuildsTheSameBinary(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	if strings.Count(df, "\nFROM ") < 2 {
		t.Error("want a multi-stage build")
	}
	if !regexp.MustCompile(`\nUSER 65532:65532\n`).MatchString(df) {
		t.Error("the runtime stage must run as 65532:65532, numerically (runAsNonRoot checks it without /etc/passwd)")
	}
	// Copied files keep the checkout's mode: under a umask of 077 root's
	// 0600, which the runtime user cannot read.
	for _, m := range regexp.MustCompile(`(?m)^COPY (.*)$`).FindAllStringSubmatch(df, -1) {
		if !strings.Contains(m[1], "--from=") && strings.Contains(m[1], "/etc/paysvc") && !strings.Contains(m[1], "--chmod=0444") {
			t.Errorf("COPY %s: the runtime user must be able to read it whatever the checkout's mode (--chmod=0444)", m[1])
		}
	}
	if !regexp.MustCompile(`HEALTHCHECK [^\n]*\\\n\s*CMD \["/paysvc", "healthcheck"`).MatchString(df) {
		t.Error("want a HEALTHCHECK that runs paysvc healthcheck (distroless has no shell or curl)")
	}
	for _, m := range regexp.MustCompile(`(?m)^(ARG|ENV)\s+(\S+)`).FindAllStringSubmatch(df, -1) {
		if regexp.MustCompile(`(?i)pass|secret|token|dsn|key`).MatchString(m[2]) {
			t.Errorf("Dockerfile %s %s: no secrets in ARG or ENV", m[1], m[2])
		}
	}
	build := regexp.MustCompile(`CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=\$\{VERSION\} -X main.revision=\$\{REVISION\}"`)
	if !build.MatchString(strings.ReplaceAll(df, "\\\n", " ")) && !build.MatchString(regexp.MustCompile(`\\\n\s*`).ReplaceAllString(df, "")) {
		t.Fatal("the Dockerfile's go build line changed: update this test to build the same way")
	}
	out := filepath.Join(t.TempDir(), "paysvc")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=v9.9.9-test -X main.revision=0123456789abcdef0123", "-o", out, "./cmd/paysvc")
	cmd.Dir, cmd.Env = "..", append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	v, err := exec.Command(out, "version").Output()
	if err != nil || !bytes.Contains(v, []byte("paysvc v9.9.9-test revision 0123456789ab ")) {
		t.Fatalf("version: %q, %v", v, err)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary is dynamically linked: it would not run on distroless/static")
		}
	}
}

// The cluster compose file: three RabbitMQ nodes forming one cluster with a
// shared cookie from the environment, Redis with a replica and three
// Sentinels, and paysvc replicas given every broker node and the Sentinels.
func TestComposeCluster(t *testing.T) {
	known := knownEnv(t)
	d := docs(t, "compose.cluster.yaml")[0]
	readOnlyServicesTakeFileSecrets(t, "compose.cluster.yaml", d)
	services, _ := d["services"].(map[string]any)
	conf, _ := get(d, "configs", "rabbitmq_conf", "content").(string)
	for _, n := range []string{"rabbit-1", "rabbit-2", "rabbit-3"} {
		if services[n] == nil || get(services[n], "hostname") != n {
			t.Errorf("no RabbitMQ node %s with its own hostname", n)
		}
		if !strings.Contains(conf, "rabbit@"+n) {
			t.Errorf("the cluster configuration does not list rabbit@%s", n)
		}
		if get(services[n], "configs", 1, "target") != "/var/lib/rabbitmq/.erlang.cookie" || get(services[n], "configs", 1, "mode") != 0o400 {
			t.Errorf("%s: the Erlang cookie is not mounted 0400 where RabbitMQ reads it", n)
		}
	}
	if get(d, "configs", "erlang_cookie", "environment") != "RABBITMQ_ERLANG_COOKIE" {
		t.Error("the Erlang cookie must come from the environment")
	}
	for _, s := range []string{"redis-master", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3", "mysql", "migrate"} {
		if services[s] == nil {
			t.Errorf("no service %s", s)
		}
	}
	sentinelCmd := fmt.Sprint(get(services["sentinel-1"], "command"))
	if !strings.Contains(sentinelCmd, "sentinel monitor paysvc redis-master 6379 2") {
		t.Errorf("the sentinels do not watch the master with a quorum of 2: %s", sentinelCmd)
	}
	// The broker URLs come in a secret file; the documented value lists every node.
	rawCluster, _ := os.ReadFile("compose.cluster.yaml")
	documented := regexp.MustCompile(`(?m)^#\s+PAYSVC_AMQP_URL=(\S+)$`).FindStringSubmatch(string(rawCluster))
	for _, n := range []string{"rabbit-1", "rabbit-2", "rabbit-3"} {
		if documented == nil || !strings.Contains(documented[1], "@"+n+":5672/") {
			t.Errorf("the documented PAYSVC_AMQP_URL does not list %s: %v", n, documented)
		}
	}
	if get(d, "secrets", "amqp_url", "environment") != "PAYSVC_AMQP_URL" || get(services["migrate"], "environment", "PAYSVC_MYSQL_DSN_FILE") != "/run/secrets/mysql_migrate_dsn" {
		t.Error("the broker URL must reach paysvc as a secret file, and migrate must use the migration user")
	}
	for _, s := range []string{"paysvc-1", "paysvc-2", "paysvc-3"} {
		env, _ := get(services[s], "environment").(map[string]any)
		if env["PAYSVC_AMQP_URL"] != nil || env["PAYSVC_AMQP_URL_FILE"] != "/run/secrets/amqp_url" {
			t.Errorf("%s: the broker URL must come from the secret file: %v", s, env)
		}
		if get(services[s], "depends_on", "grants", "condition") != "service_completed_successfully" {
			t.Errorf("%s: must wait for its least-privilege user (grants)", s)
		}
		if env["PAYSVC_REDIS_MASTERNAME"] != "paysvc" || !strings.Contains(fmt.Sprint(env["PAYSVC_REDIS_ADDR"]), "sentinel-3:26379") {
			t.Errorf("%s: Redis is not reached through the Sentinels", s)
		}
		for name := range env {
			if strings.HasPrefix(name, "PAYSVC_") && !known[name] {
				t.Errorf("%s sets %s, which paysvc does not know", s, name)
			}
		}
	}
	// The image's CMD reads its config file; a command that replaces it
	// must name the file too, or the daemon runs on the defaults and
	// ignores the image's (or a mounted) config.yaml without a word.
	for _, s := range []string{"paysvc-1", "paysvc-2", "paysvc-3", "migrate"} {
		cmd := fmt.Sprint(get(services[s], "command"))
		if !strings.Contains(cmd, "--config /etc/paysvc/config.yaml") {
			t.Errorf("%s: command %s drops the image's --config /etc/paysvc/config.yaml", s, cmd)
		}
	}
	if get(services["migrate"], "build", "args", "VERSION") == nil || get(services["migrate"], "build", "args", "REVISION") == nil {
		t.Errorf("migrate's build does not stamp VERSION and REVISION: %v", get(services["migrate"], "build"))
	}
	raw, _ := os.ReadFile("compose.cluster.yaml")
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		key := regexp.MustCompile(`^\s*[A-Za-z_]*(PASSWORD|PASS|password|COOKIE)\s*:\s*(\S+)`).FindStringSubmatch(line)
		// A switch (PAYSVC_ADMIN_SECURECOOKIE: "false") holds no secret.
		flag := key != nil && regexp.MustCompile(`^"?(true|false)"?$`).MatchString(key[2])
		if key != nil && !strings.HasPrefix(key[2], "${") && !flag || inlineSecret.MatchString(line) {
			t.Errorf("compose.cluster.yaml holds a literal secret: %s", strings.TrimSpace(line))
		}
	}
}

// The variables Compose reads (interpolations, secrets sourced from the
// environment, deploy/images.env.example) sit in an operator's shell or
// deploy/.env: a PAYSVC_ one must be a name paysvc knows, or every paysvc
// command run from that shell stops at start-up refusing it.
func TestComposeVariablesArePaysvcKeysOrNotPaysvcs(t *testing.T) {
	known := knownEnv(t)
	interpolation := regexp.MustCompile(`\$\{(PAYSVC_[A-Z0-9_]+)`)
	envLine := regexp.MustCompile(`(?m)^\s*(?:#\s*)?(PAYSVC_[A-Z0-9_]+)=`)
	for _, f := range []string{"compose.yaml", "compose.cluster.yaml", "images.env.example"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range interpolation.FindAllStringSubmatch(string(raw), -1) {
			names = append(names, m[1])
		}
		for _, m := range envLine.FindAllStringSubmatch(string(raw), -1) {
			names = append(names, m[1])
		}
		if strings.HasPrefix(f, "compose") {
			secrets, _ := docs(t, f)[0]["secrets"].(map[string]any)
			for _, sec := range secrets {
				if name, _ := get(sec, "environment").(string); strings.HasPrefix(name, "PAYSVC_") {
					names = append(names, name)
				}
			}
		}
		for _, name := range names {
			if !known[name] {
				t.Errorf("%s: %s is not a paysvc key, and paysvc refuses an unknown PAYSVC_ variable in its environment", f, name)
			}
		}
	}
}
