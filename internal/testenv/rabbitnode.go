package testenv

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RabbitNode starts a RabbitMQ node of the test's own on loopback ports of
// its own (Debian's rabbitmq-server, run as the rabbitmq user, so it needs
// root), for what a vhost cannot isolate: resource alarms, TLS listeners,
// node-wide settings. conf is added to its rabbitmq.conf; files (name →
// content) are written next to it, readable by the node ({{DIR}} in conf
// is their directory). It returns the node's name, its directory and its
// AMQP address (the plain listener unless conf sets listeners.tcp = none;
// then the port of listeners.ssl.default must be {{PORT}} in conf). The
// node is stopped at the end of the test.
func RabbitNode(t testing.TB, conf string, files map[string][]byte) (node, dir, addr string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("starting a RabbitMQ node of its own needs root (Debian's rabbitmq-server runs as rabbitmq)")
	}
	dir, err := os.MkdirTemp("", "paysvc-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil { // the node runs as rabbitmq
			t.Fatal(err)
		}
	}
	for _, sub := range []string{"mnesia", "log"} {
		os.MkdirAll(filepath.Join(dir, sub), 0o755)
		exec.Command("chown", "-R", "rabbitmq", filepath.Join(dir, sub)).Run()
	}
	addr = FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	_, distPort, _ := net.SplitHostPort(FreeAddr(t))
	node = "paysvc_test_" + port + "@localhost"
	if !strings.Contains(conf, "listeners.tcp") {
		conf = "listeners.tcp.default = 127.0.0.1:" + port + "\n" + conf
	}
	conf = strings.NewReplacer("{{PORT}}", port, "{{DIR}}", dir).Replace(conf)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644)
	srv := exec.Command("rabbitmq-server")
	srv.Env = append(os.Environ(), "RABBITMQ_NODENAME="+node, "RABBITMQ_DIST_PORT="+distPort,
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"), "RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "mnesia", "pid"))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("rabbitmqctl", "-n", node, "-q", "stop").Run()
		srv.Process.Kill()
		srv.Wait()
	})
	WaitPort(t, addr)
	return node, dir, addr
}

// RabbitCtl runs rabbitmqctl against node (a RabbitNode's), failing the
// test on an error.
func RabbitCtl(t testing.TB, node string, args ...string) string {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-n", node, "-q"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// MemoryAlarm sets off a memory alarm on node (a RabbitNode's: the
// watermark set to nothing) and waits until the broker reports it. clear
// ends it; the test's cleanup ends it too if the test did not.
func MemoryAlarm(t testing.TB, node string) (clear func()) {
	t.Helper()
	RabbitCtl(t, node, "set_vm_memory_high_watermark", "0.0000001")
	Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(RabbitCtl(t, node, "eval", "rabbit_alarm:get_alarms()."), "memory")
	}, "the memory alarm never went off")
	var once sync.Once
	clear = func() { once.Do(func() { RabbitCtl(t, node, "set_vm_memory_high_watermark", "0.4") }) }
	t.Cleanup(clear)
	return clear
}
