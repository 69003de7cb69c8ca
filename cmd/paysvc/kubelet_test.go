package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paysvc/paysvc/internal/testenv"
)

// podSecrets is what deploy/k8s/base/deployment.yaml says about the pod's user
// and its Secret volume.
type podSecrets struct {
	uid, gid, fsGroup int // fsGroup -1: not set
	mode              os.FileMode
}

func readPodSecrets(t *testing.T) podSecrets {
	t.Helper()
	b, err := os.ReadFile("../../deploy/k8s/base/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					SecurityContext struct {
						RunAsUser  int  `yaml:"runAsUser"`
						RunAsGroup int  `yaml:"runAsGroup"`
						FSGroup    *int `yaml:"fsGroup"`
					} `yaml:"securityContext"`
					Volumes []struct {
						Secret *struct {
							DefaultMode *int `yaml:"defaultMode"`
						} `yaml:"secret"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	ps := podSecrets{uid: pod.SecurityContext.RunAsUser, gid: pod.SecurityContext.RunAsGroup, fsGroup: -1, mode: 0o644}
	if pod.SecurityContext.FSGroup != nil {
		ps.fsGroup = *pod.SecurityContext.FSGroup
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.DefaultMode != nil {
			ps.mode = os.FileMode(*v.Secret.DefaultMode)
		}
	}
	return ps
}

// mount writes a secret file the way the kubelet leaves it: owned by root;
// with an fsGroup, group-owned by it and group-readable (the kubelet adds
// 0440 to a read-only volume's files), else root's group and the mode as
// given.
func (ps podSecrets) mount(t *testing.T, dir, name, value string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	gid, mode := 0, ps.mode
	if ps.fsGroup >= 0 {
		gid, mode = ps.fsGroup, mode|0o440
	}
	if err := os.Chown(p, 0, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// The pod runs as a non-root uid and reads its DSN from a mounted Secret.
// Reproduced as the kubelet mounts it, from the manifest's own settings:
// paysvc, run as the manifest's uid and gid (setpriv), reads the file and
// migrates; without the fsGroup (the manifest before this fix: mode 0400,
// files root's) it cannot, and says which file.
func TestSecretFilesReadableAsTheKubeletMountsThem(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to own files as the kubelet does and to switch uid (CI runs as root)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatal("setpriv (util-linux) is needed to run paysvc as the pod's uid")
	}
	ps := readPodSecrets(t)
	if ps.uid == 0 || ps.fsGroup < 0 {
		t.Fatalf("deployment.yaml: runAsUser %d, fsGroup %d: want a non-root user and an fsGroup", ps.uid, ps.fsGroup)
	}
	// A directory the pod's user can enter, with the binary in it.
	dir, err := os.MkdirTemp("", "paysvc-kubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "paysvc")
	b, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	dsn, _ := testenv.MySQL(t)
	for _, c := range []struct {
		name string
		ps   podSecrets
		ok   bool
	}{
		{"the manifest", ps, true},
		{"no fsGroup, mode 0400", podSecrets{uid: ps.uid, gid: ps.gid, fsGroup: -1, mode: 0o400}, false},
	} {
		secrets := filepath.Join(dir, fmt.Sprintf("secrets-%v", c.ok))
		os.Mkdir(secrets, 0o755)
		file := c.ps.mount(t, secrets, "migrate_dsn", dsn)
		cmd := exec.Command(setpriv, fmt.Sprintf("--reuid=%d", c.ps.uid), fmt.Sprintf("--regid=%d", c.ps.gid), "--clear-groups",
			bin, "migrate")
		cmd.Dir = dir
		cmd.Env = []string{"PAYSVC_MYSQL_DSN_FILE=" + file}
		out, err := cmd.CombinedOutput()
		st, _ := os.Stat(file)
		t.Logf("%s: %s mode %v: %v", c.name, file, st.Mode(), err)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: paysvc as %d:%d could not migrate: %v\n%s", c.name, c.ps.uid, c.ps.gid, err, out)
		case !c.ok && err == nil:
			t.Errorf("%s: paysvc as %d:%d read a root-only secret: the reproduction is wrong", c.name, c.ps.uid, c.ps.gid)
		case !c.ok && !strings.Contains(string(out), "permission denied"):
			t.Errorf("%s: the failure does not say why:\n%s", c.name, out)
		}
	}
}
