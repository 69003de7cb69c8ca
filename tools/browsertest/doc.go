// Package browsertest drives the admin pages of a running paysvc daemon in
// a headless Chromium: sign in, filter, replay and discard, one row and in
// bulk. It lives in the tools module so that the browser driver stays out
// of the service's dependencies; its tests build cmd/paysvc and run the
// binary against the real servers, as the service's end-to-end tests do.
package browsertest
