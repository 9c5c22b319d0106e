package redlock_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testenv"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key to
// dir, and returns their paths.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dlock test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestTLS locks over redlocks:// on three servers that speak TLS.
func TestTLS(t *testing.T) {
	cert, key := selfSigned(t, t.TempDir())
	var addrs []string
	for range 3 {
		port := testenv.FreePort(t)
		// The plain port stays open for testenv's readiness probe.
		testenv.StartRedis(t, testenv.WithRedisArgs("--tls-port", strconv.Itoa(port),
			"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"))
		addrs = append(addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	ctx := testCtx(t)
	// go-redis's ParseURL takes no CA file; skip_verify keeps the test to
	// the TLS wiring itself.
	l, err := dlock.Open(ctx, "redlocks://"+strings.Join(addrs, ",")+"?skip_verify=true")
	if err != nil {
		t.Fatalf("Open over TLS: %v", err)
	}
	defer l.Close()
	lease, err := l.TryAcquire(ctx, "tls")
	if err != nil {
		t.Fatalf("TryAcquire over TLS: %v", err)
	}
	release(t, lease)
	// Without TLS, the TLS ports do not answer.
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if l, err := dlock.Open(octx, "redlock://"+strings.Join(addrs, ",")); err == nil {
		_ = l.Close()
		t.Error("plain redlock:// to the TLS ports succeeded")
	}
}
