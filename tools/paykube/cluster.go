package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cluster is an etcd and a kube-apiserver of their own on loopback, in a
// temporary directory: no controller manager, no scheduler, no node. The
// API server's admission (PodSecurity among it) and validation are all
// this needs; nothing ever runs.
type cluster struct {
	dir    string
	etcd   *process
	api    *process
	url    string // https://127.0.0.1:port
	client *http.Client
}

type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// start runs the binary with its output in dir/name.log. It gets SIGKILL
// if this program dies first (Pdeathsig), so an interrupted run leaves no
// server behind.
func start(dir, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, and SIGKILL after the grace period.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail is the end of the process's log, for an error message.
func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePorts finds n loopback ports free at this moment. Another process
// may take one before the server binds it: startCluster retries.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startCluster starts etcd and kube-apiserver and waits until the API
// server is ready, retrying on fresh ports when a port was taken meanwhile.
func startCluster(ctx context.Context, etcdBin, apiBin string, timeout time.Duration) (*cluster, error) {
	var last error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := startClusterOnce(ctx, etcdBin, apiBin, timeout)
		if err == nil {
			return c, nil
		}
		last = err
		if ctx.Err() != nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		fmt.Fprintf(os.Stderr, "paykube: start failed (attempt %d): %v\n", attempt, err)
	}
	return nil, last
}

func startClusterOnce(ctx context.Context, etcdBin, apiBin string, timeout time.Duration) (_ *cluster, err error) {
	dir, err := os.MkdirTemp("", "paykube-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	tlsConf, err := writeCerts(dir)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}

	clientURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	c.etcd, err = start(dir, "etcd", etcdBin,
		"--name", "paykube",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "paykube="+peerURL,
		"--unsafe-no-fsync", // a throwaway store: nothing to keep across a crash
		"--log-level", "warn",
	)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, c.etcd, http.DefaultClient, clientURL+"/health", timeout); err != nil {
		return nil, err
	}

	c.api, err = start(dir, "kube-apiserver", apiBin,
		"--etcd-servers", clientURL,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		// No Endpoints for the kubernetes Service: the reconciler refuses
		// a loopback address, and nothing here would use them.
		"--endpoint-reconciler-type", "none",
		"--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--tls-cert-file", filepath.Join(dir, "server.crt"),
		"--tls-private-key-file", filepath.Join(dir, "server.key"),
		// Clients authenticate with a certificate from this CA; the
		// suite's own is in system:masters.
		"--client-ca-file", filepath.Join(dir, "ca.crt"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24",
		// PodSecurity is on by default; named so that a change of the
		// defaults cannot turn it off unnoticed (the negative checks would).
		"--enable-admission-plugins", "NamespaceLifecycle,ServiceAccount,PodSecurity,LimitRanger,ResourceQuota",
		// As clusters run (kubeadm, kind): privileged containers allowed
		// by the server, so that refusing them is Pod Security's doing
		// alone, which the negative checks look for.
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	)
	if err != nil {
		return nil, err
	}
	c.url = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	c.client = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConf}, Timeout: 60 * time.Second}
	if err := waitHTTP(ctx, c.api, c.client, c.url+"/readyz", timeout); err != nil {
		return nil, err
	}
	return c, nil
}

// waitHTTP polls url until it answers 200, the process exits, or the
// deadline passes.
func waitHTTP(ctx context.Context, p *process, client *http.Client, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		if p.exited() {
			return fmt.Errorf("%s exited (%v) before it was ready; its log ends:\n%s", p.name, p.err, p.tail(30))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(b.String()))
		} else {
			last = err.Error()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (%s); its log ends:\n%s", p.name, timeout, last, p.tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// close stops both servers and removes the directory (etcd's data, the
// keys, the logs).
func (c *cluster) close() {
	c.api.stop(10 * time.Second)
	c.etcd.stop(10 * time.Second)
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// writeCerts writes a CA, the API server's certificate for 127.0.0.1 and
// localhost, the service-account key pair, and returns the client's TLS
// configuration: it trusts only that CA and presents a certificate of the
// group system:masters.
func writeCerts(dir string) (*tls.Config, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "paykube CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	leaf := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) ([]byte, *ecdsa.PrivateKey, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      subject,
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		return der, key, err
	}
	serverDER, serverKey, err := leaf(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	clientDER, clientKey, err := leaf(3, pkix.Name{CommonName: "paykube", Organization: []string{"system:masters"}},
		x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	serverKeyDER, err := x509.MarshalECPrivateKey(serverKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.crt":     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serverDER}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: serverKeyDER}),
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if clientKey == nil {
		return nil, errors.New("no client key")
	}
	return &tls.Config{
		RootCAs:    pool,
		ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{
			Certificate: [][]byte{clientDER},
			PrivateKey:  clientKey,
		}},
	}, nil
}
