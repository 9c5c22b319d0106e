package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// KubeVersion is the version of k8s.io/kubernetes whose kube-apiserver
// KubeAPIServerBinary builds (its staging modules at the matching v0.x).
const KubeVersion = "v1.37.2"

// KubeAPIServerEnv names the environment variable that, when set, gives the
// path of the kube-apiserver binary to use instead of the one
// KubeAPIServerBinary builds.
const KubeAPIServerEnv = "DLOCK_KUBE_APISERVER"

// KubeEnv names the environment variable that gates the Kubernetes tests:
// with "1" they run, on the cached kube-apiserver or one built first (about 6
// minutes on an idle 2-core machine), and a failed build fails under CI=true;
// unset, they are skipped unless KubeAPIServerEnv names a binary.
const KubeEnv = "DLOCK_K8S"

// kubeModule is the throw-away module that builds kube-apiserver: go.mod
// (stored as go.mod.txt so that it is no module of this repository), go.sum
// and main.go.
//
//go:embed testdata/kube-apiserver/go.mod.txt testdata/kube-apiserver/go.sum testdata/kube-apiserver/main.go
var kubeModule embed.FS

var kubeBuild sync.Mutex

// KubeAPIServerBinary returns the path of a kube-apiserver binary:
// $DLOCK_KUBE_APISERVER if set; else the one cached in the user's cache
// directory (dlock-testenv/kube-apiserver-KubeVersion/ under
// os.UserCacheDir()); else one built there from the module proxy with the
// module of testdata/kube-apiserver. Without DLOCK_K8S=1 (and no
// $DLOCK_KUBE_APISERVER) the test is skipped, also under CI (the build does
// not fit CI's time); a failed build skips it, or fails it under CI=true.
func KubeAPIServerBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(KubeAPIServerEnv); p != "" {
		return p
	}
	if os.Getenv(KubeEnv) != "1" {
		t.Skipf("testenv: the Kubernetes tests run with %s=1 (or %s naming a kube-apiserver)", KubeEnv, KubeAPIServerEnv)
	}
	kubeBuild.Lock()
	defer kubeBuild.Unlock()
	cache, err := os.UserCacheDir()
	if err != nil {
		kubeMissing(t, err)
		return ""
	}
	dir := filepath.Join(cache, "dlock-testenv", "kube-apiserver-"+KubeVersion)
	bin := filepath.Join(dir, "kube-apiserver")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	start := time.Now()
	if err := buildKubeAPIServer(dir, bin); err != nil {
		kubeMissing(t, err)
		return ""
	}
	t.Logf("testenv: built kube-apiserver %s in %v", KubeVersion, time.Since(start).Round(time.Second))
	return bin
}

// buildKubeAPIServer writes the embedded module into a new directory beside
// bin, builds it there and renames the binary into place, so that a
// concurrent build in another test binary never leaves a half-written file.
func buildKubeAPIServer(dir, bin string) error {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for src, dst := range map[string]string{"go.mod.txt": "go.mod", "go.sum": "go.sum", "main.go": "main.go"} {
		b, err := kubeModule.ReadFile("testdata/kube-apiserver/" + src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, dst), b, 0o644); err != nil {
			return err
		}
	}
	cmd := exec.Command(goCmd, "build", "-trimpath", "-o", "kube-apiserver", ".")
	cmd.Dir = tmp
	// A module outside any workspace: the test's own go.work must not apply.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build kube-apiserver %s: %w\n%s", KubeVersion, err, out)
	}
	return os.Rename(filepath.Join(tmp, "kube-apiserver"), bin)
}

func kubeMissing(t testing.TB, err error) {
	t.Helper()
	const format = "testenv: no kube-apiserver %s (set %s, or %s=1 to build it): %v"
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+"; CI=true, so this fails instead of skipping", KubeVersion, KubeAPIServerEnv, KubeEnv, err)
	} else {
		t.Skipf(format, KubeVersion, KubeAPIServerEnv, KubeEnv, err)
	}
}

// KubeAPIServer is a kube-apiserver the test owns, over an etcd it owns,
// started by StartKubeAPIServer. The embedded Process controls the API
// server; Etcd its storage.
type KubeAPIServer struct {
	*Process
	// Etcd is the API server's storage.
	Etcd *Etcd
	// Token is the bearer token of the user "dlock-test" (group
	// system:masters; authorization is AlwaysAllow).
	Token string
	// CAData is the PEM of the self-signed serving certificate, the CA a
	// client trusts.
	CAData []byte
	// Kubeconfig is the path of a kubeconfig file for Host, CAData and
	// Token, with the context "dlock-test" current.
	Kubeconfig string

	port int
}

// kubeReadyTimeout bounds the API server's start: 3s when idle, many times
// that on a loaded machine.
const kubeReadyTimeout = 90 * time.Second

// StartKubeAPIServer starts an etcd (StartEtcd) and a kube-apiserver
// (KubeAPIServerBinary) on it, on a free 127.0.0.1 port, with a self-signed
// serving certificate, a static token file, AlwaysAllow authorization and
// a service-account key made in-process:
//
//	kube-apiserver --etcd-servers http://127.0.0.1:C --etcd-prefix /P
//	  --secure-port S --bind-address 127.0.0.1 --advertise-address 127.0.0.1
//	  --endpoint-reconciler-type none --tls-cert-file … --tls-private-key-file …
//	  --token-auth-file … --authorization-mode AlwaysAllow …
//
// It returns once /readyz answers ok (with the token) and the port's
// listening socket belongs to the child, retrying on another port when it
// was taken; the server is stopped in t.Cleanup.
func StartKubeAPIServer(t testing.TB) *KubeAPIServer {
	t.Helper()
	bin := KubeAPIServerBinary(t)
	etcd := StartEtcd(t)
	dir := t.TempDir()
	k := &KubeAPIServer{Etcd: etcd}
	certFile, keyFile, err := writeServingCert(dir, k)
	if err != nil {
		t.Fatalf("testenv: serving certificate: %v", err)
	}
	saKey, err := writeSAKey(dir)
	if err != nil {
		t.Fatalf("testenv: service-account key: %v", err)
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	k.Token = hex.EncodeToString(tok)
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(k.Token+",dlock-test,dlock-test,\"system:masters\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prefix := make([]byte, 6)
	_, _ = rand.Read(prefix)
	return startRetrying(t, "StartKubeAPIServer", func() (*KubeAPIServer, error) {
		k.port = FreePort(t)
		k.Process = NewProcess(t, ProcessConfig{
			Name: "kube-apiserver",
			Path: bin,
			Args: []string{
				"--etcd-servers=http://" + etcd.Endpoint(),
				"--etcd-prefix=/dlock-" + hex.EncodeToString(prefix),
				"--secure-port=" + strconv.Itoa(k.port),
				"--bind-address=127.0.0.1",
				"--advertise-address=127.0.0.1",
				"--endpoint-reconciler-type=none",
				"--tls-cert-file=" + certFile,
				"--tls-private-key-file=" + keyFile,
				"--cert-dir=" + filepath.Join(dir, "certs"),
				"--token-auth-file=" + tokenFile,
				"--authorization-mode=AlwaysAllow",
				"--service-account-issuer=https://kubernetes.default.svc",
				"--service-account-key-file=" + saKey,
				"--service-account-signing-key-file=" + saKey,
				"--service-cluster-ip-range=10.96.0.0/24",
				"--enable-priority-and-fairness=false",
				"--profiling=false",
				"--v=0",
			},
			Dir:          dir,
			Ports:        []int{k.port},
			Ready:        k.ready,
			ReadyTimeout: kubeReadyTimeout,
			// The readiness probe is an HTTPS request: no need to hurry.
			ReadyInterval: 100 * time.Millisecond,
		})
		if err := k.Start(); err != nil {
			return nil, err
		}
		path, err := k.writeKubeconfig(dir)
		if err != nil {
			return nil, err
		}
		k.Kubeconfig = path
		return k, nil
	})
}

// Host returns the API server's URL, "https://127.0.0.1:PORT".
func (k *KubeAPIServer) Host() string {
	return "https://" + k.Endpoint()
}

// Endpoint returns the API server's address, "127.0.0.1:PORT".
func (k *KubeAPIServer) Endpoint() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(k.port))
}

// ready checks that /readyz answers ok to the test's token and that the
// port's listening socket belongs to pid.
func (k *KubeAPIServer) ready(ctx context.Context, pid int) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.CAData)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.Host()+"/readyz", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+k.Token)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz answered %s", resp.Status)
	}
	return listenerOwnedBy(pid, k.port)
}

// writeServingCert makes a self-signed ECDSA certificate for 127.0.0.1 and
// localhost, writes it and its key under dir, and keeps its PEM in
// k.CAData.
func writeServingCert(dir string, k *KubeAPIServer) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "dlock-test kube-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	k.CAData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	certFile, keyFile = filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")
	if err := os.WriteFile(certFile, k.CAData, 0o644); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
}

// writeSAKey writes an RSA key for service-account tokens under dir.
func writeSAKey(dir string) (string, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "sa.key")
	return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

// writeKubeconfig writes a kubeconfig for the server and the test's token.
func (k *KubeAPIServer) writeKubeconfig(dir string) (string, error) {
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, []byte(KubeconfigFor(k.Host(), k.CAData, k.Token)), 0o600)
}

// KubeconfigFor returns a kubeconfig (YAML) with one cluster at host
// trusting caPEM, one user with the bearer token, and the current context
// "dlock-test" joining them: for a server reached through a proxy.
func KubeconfigFor(host string, caPEM []byte, token string) string {
	// JSON is YAML; strconv.Quote gives valid JSON strings for these values.
	return `{"apiVersion": "v1", "kind": "Config",
"clusters": [{"name": "dlock-test", "cluster": {"server": ` + strconv.Quote(host) +
		`, "certificate-authority-data": ` + strconv.Quote(base64.StdEncoding.EncodeToString(caPEM)) + `}}],
"users": [{"name": "dlock-test", "user": {"token": ` + strconv.Quote(token) + `}}],
"contexts": [{"name": "dlock-test", "context": {"cluster": "dlock-test", "user": "dlock-test"}}],
"current-context": "dlock-test"}
`
}
