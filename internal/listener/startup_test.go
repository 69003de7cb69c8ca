package listener

import (
	"errors"
	"strings"
	"testing"
)

// Run stops on a fatal error only while no session has ended otherwise:
// at once for a clear one, at the loginAttempts-th in a row for an
// ambiguous refused login. Later, fatal errors are reconnected.
func TestStartupStop(t *testing.T) {
	lost := errors.New("connection reset")
	mismatch := &fatalError{err: errors.New("PRECONDITION_FAILED")}
	login := &fatalError{err: errors.New("username or password not allowed"), ambiguous: true}

	t.Run("clear fatal first", func(t *testing.T) {
		var s startup
		if err := s.stop(mismatch); err != mismatch {
			t.Fatalf("stop: %v, want the fatal error", err)
		}
	})
	t.Run("ambiguous login refusals in a row", func(t *testing.T) {
		var s startup
		for i := 1; i < loginAttempts; i++ {
			if err := s.stop(login); err != nil {
				t.Fatalf("refusal %d: stop %v, want nil (reconnect)", i, err)
			}
		}
		err := s.stop(login)
		if !errors.Is(err, login) || !strings.Contains(err.Error(), "times in a row") {
			t.Fatalf("refusal %d: stop %v, want the refusal, counted", loginAttempts, err)
		}
	})
	t.Run("a refusal then a clear fatal", func(t *testing.T) {
		var s startup
		if err := s.stop(login); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if err := s.stop(mismatch); err != mismatch {
			t.Fatalf("stop: %v, want the fatal error", err)
		}
	})
	t.Run("fatal after another end", func(t *testing.T) {
		var s startup
		if err := s.stop(lost); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if err := s.stop(mismatch); err != nil {
			t.Fatalf("fatal after a session ended otherwise: stop %v, want nil (reconnect)", err)
		}
		for range loginAttempts {
			if err := s.stop(login); err != nil {
				t.Fatalf("refused login after start-up: stop %v, want nil", err)
			}
		}
	})
}
