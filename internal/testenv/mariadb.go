package testenv

import (
	"net"
	"os"
	"os/exec"
	"testing"
	"time"
)

// FreeAddr returns a loopback address with a port nobody listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// WaitPort waits until something listens on addr.
func WaitPort(t testing.TB, addr string) {
	t.Helper()
	Eventually(t, 30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, "nothing listens on %s", addr)
}

// MariaDB starts a throwaway mariadbd of the test's own on a fresh datadir
// (Debian's mariadb-install-db, a few seconds), with extra server options,
// and returns its address; root has no password. It is killed and its
// files removed when the test ends. The shared server is never touched.
func MariaDB(t testing.TB, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+dir+"/data",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	addr := FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	args := append([]string{"--no-defaults", "--datadir=" + dir + "/data", "--port=" + port, "--bind-address=127.0.0.1",
		"--socket=" + dir + "/sock", "--pid-file=" + dir + "/pid", "--innodb-buffer-pool-size=16M"}, extra...)
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	srv := exec.Command("mariadbd", args...)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	WaitPort(t, addr)
	return addr
}
