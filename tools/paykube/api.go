package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// fieldManager names the suite in managedFields (of the dry runs: nothing
// is stored).
const fieldManager = "paysvc-test"

// object is one manifest, as JSON.
type object map[string]any

func (o object) str(path ...string) string {
	var v any = map[string]any(o)
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

func (o object) apiVersion() string { return o.str("apiVersion") }
func (o object) kind() string       { return o.str("kind") }
func (o object) name() string       { return o.str("metadata", "name") }
func (o object) namespace() string  { return o.str("metadata", "namespace") }

func (o object) String() string {
	s := o.apiVersion() + " " + o.kind() + " "
	if ns := o.namespace(); ns != "" {
		s += ns + "/"
	}
	return s + o.name()
}

// clone is a deep copy, for the negative checks' mutations.
func (o object) clone() object {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	var c object
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return c
}

// resource is what discovery says of a kind: its plural (the URL's path
// segment) and whether it lives in a namespace.
type resource struct {
	name       string
	namespaced bool
}

// api talks to the API server: discovery, apply, get.
type api struct {
	base   string
	client *http.Client
	// apiVersion -> kind -> resource, filled on first use of an apiVersion
	// and refreshed when a kind is missing (a CRD just installed).
	discovery map[string]map[string]resource
}

// result is an answer of the API server: its status, its Warning headers,
// and for an error the Status message.
type result struct {
	code     int
	warnings []string
	message  string
	body     []byte
}

func (r result) ok() bool { return r.code >= 200 && r.code < 300 }

func (r result) String() string {
	if r.ok() {
		return fmt.Sprintf("%d", r.code)
	}
	return fmt.Sprintf("%d %s", r.code, r.message)
}

func (a *api) do(ctx context.Context, method, path, contentType string, body []byte) (result, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return result{}, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	r := result{code: resp.StatusCode, body: b}
	for _, w := range resp.Header.Values("Warning") {
		r.warnings = append(r.warnings, warningText(w))
	}
	if !r.ok() {
		var st struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			r.message = st.Message
		} else {
			r.message = strings.TrimSpace(string(b))
		}
	}
	return r, nil
}

// warningText is the text of a Warning header: `299 - "text"`.
func warningText(h string) string {
	parts := strings.SplitN(h, " ", 3)
	if len(parts) == 3 && parts[0] == "299" {
		t := strings.TrimSpace(parts[2])
		if len(t) >= 2 && t[0] == '"' && t[len(t)-1] == '"' {
			return strings.ReplaceAll(t[1:len(t)-1], `\"`, `"`)
		}
		return t
	}
	return h
}

// groupPath is the URL path of an apiVersion: /api/v1 or /apis/group/version.
func groupPath(apiVersion string) string {
	if !strings.Contains(apiVersion, "/") {
		return "/api/" + apiVersion
	}
	return "/apis/" + apiVersion
}

func (a *api) discover(ctx context.Context, apiVersion string) (map[string]resource, error) {
	r, err := a.do(ctx, http.MethodGet, groupPath(apiVersion), "", nil)
	if err != nil {
		return nil, err
	}
	if r.code == http.StatusNotFound {
		return map[string]resource{}, nil
	}
	if !r.ok() {
		return nil, fmt.Errorf("discovery of %s: %s", apiVersion, r)
	}
	var list struct {
		Resources []struct {
			Name       string `json:"name"`
			Kind       string `json:"kind"`
			Namespaced bool   `json:"namespaced"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil {
		return nil, fmt.Errorf("discovery of %s: %w", apiVersion, err)
	}
	kinds := map[string]resource{}
	for _, res := range list.Resources {
		if strings.Contains(res.Name, "/") { // a subresource
			continue
		}
		kinds[res.Kind] = resource{name: res.Name, namespaced: res.Namespaced}
	}
	return kinds, nil
}

// resourceOf finds the kind's resource. A kind the server does not serve
// is an error: its CRD is missing, or its apiVersion is gone.
func (a *api) resourceOf(ctx context.Context, apiVersion, kind string) (resource, error) {
	if a.discovery == nil {
		a.discovery = map[string]map[string]resource{}
	}
	if res, ok := a.discovery[apiVersion][kind]; ok {
		return res, nil
	}
	kinds, err := a.discover(ctx, apiVersion)
	if err != nil {
		return resource{}, err
	}
	a.discovery[apiVersion] = kinds
	if res, ok := kinds[kind]; ok {
		return res, nil
	}
	return resource{}, fmt.Errorf("the API server does not serve %s %s (a CustomResourceDefinition not installed, or an API version it no longer serves)", apiVersion, kind)
}

// path is the object's URL path; a namespaced object without a namespace
// goes to ns.
func (a *api) path(ctx context.Context, o object, ns string) (string, error) {
	res, err := a.resourceOf(ctx, o.apiVersion(), o.kind())
	if err != nil {
		return "", err
	}
	p := groupPath(o.apiVersion())
	if res.namespaced {
		if o.namespace() != "" {
			ns = o.namespace()
		}
		p += "/namespaces/" + url.PathEscape(ns)
	}
	return p + "/" + res.name + "/" + url.PathEscape(o.name()), nil
}

// apply sends the object as a server-side apply with strict field
// validation; dryRun: the server admits and validates it in full and
// stores nothing.
func (a *api) apply(ctx context.Context, o object, ns string, dryRun bool) (result, error) {
	body, err := json.Marshal(o)
	if err != nil {
		return result{}, err
	}
	return a.applyBody(ctx, o, ns, dryRun, body)
}

// applyBody is apply with the request's body as given (the negative checks
// send one with a duplicated field).
func (a *api) applyBody(ctx context.Context, o object, ns string, dryRun bool, body []byte) (result, error) {
	p, err := a.path(ctx, o, ns)
	if err != nil {
		return result{}, err
	}
	q := url.Values{
		"fieldValidation": {"Strict"},
		"fieldManager":    {fieldManager},
		"force":           {"true"},
	}
	if dryRun {
		q.Set("dryRun", "All")
	}
	// JSON is YAML: the apply content type takes either.
	return a.do(ctx, http.MethodPatch, p+"?"+q.Encode(), "application/apply-patch+yaml", body)
}

func (a *api) get(ctx context.Context, path string) (object, error) {
	r, err := a.do(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return nil, err
	}
	if !r.ok() {
		return nil, fmt.Errorf("GET %s: %s", path, r)
	}
	var o object
	return o, json.Unmarshal(r.body, &o)
}

// waitEstablished waits until the CustomResourceDefinition is established
// and its kind shows in discovery.
func (a *api) waitEstablished(ctx context.Context, crd object, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	group := crd.str("spec", "group")
	kind := crd.str("spec", "names", "kind")
	for {
		o, err := a.get(ctx, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"+url.PathEscape(crd.name()))
		if err != nil {
			return err
		}
		established := false
		if st, ok := o["status"].(map[string]any); ok {
			conds, _ := st["conditions"].([]any)
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					established = true
				}
			}
		}
		if established {
			versions, _ := crd["spec"].(map[string]any)["versions"].([]any)
			served := true
			for _, v := range versions {
				m, _ := v.(map[string]any)
				if s, _ := m["served"].(bool); !s {
					continue
				}
				name, _ := m["name"].(string)
				kinds, err := a.discover(ctx, group+"/"+name)
				if err != nil {
					return err
				}
				if _, ok := kinds[kind]; !ok {
					served = false
				}
			}
			if served {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CustomResourceDefinition %s not established after %s", crd.name(), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
