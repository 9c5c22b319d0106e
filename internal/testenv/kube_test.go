package testenv

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStartKubeAPIServer starts a real API server and proves what the k8s
// driver relies on: a Lease can be created with the static token, and an
// update carrying a stale resourceVersion is refused with 409 Conflict.
func TestStartKubeAPIServer(t *testing.T) {
	start := time.Now()
	k := StartKubeAPIServer(t)
	t.Logf("etcd and kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.CAData)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	do := func(method, path, token string, body any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, err := http.NewRequest(method, k.Host()+path, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	const leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases"
	if code, _ := do(http.MethodGet, leases, "wrong-token", nil); code != http.StatusUnauthorized {
		t.Errorf("a wrong token got %d, want 401", code)
	}
	lease := map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "probe"}, "spec": map[string]any{"holderIdentity": "a"}}
	code, created := do(http.MethodPost, leases, k.Token, lease)
	if code != http.StatusCreated {
		t.Fatalf("create Lease: %d %v", code, created)
	}
	rv := created["metadata"].(map[string]any)["resourceVersion"].(string)
	lease["metadata"] = map[string]any{"name": "probe", "resourceVersion": rv}
	lease["spec"] = map[string]any{"holderIdentity": "b"}
	if code, out := do(http.MethodPut, leases+"/probe", k.Token, lease); code != http.StatusOK {
		t.Fatalf("update with the current resourceVersion: %d %v", code, out)
	}
	lease["spec"] = map[string]any{"holderIdentity": "c"}
	code, out := do(http.MethodPut, leases+"/probe", k.Token, lease) // rv is stale now
	if code != http.StatusConflict || !strings.Contains(out["message"].(string), "modified") {
		t.Fatalf("update with a stale resourceVersion: %d %v, want 409 Conflict", code, out)
	}
}
