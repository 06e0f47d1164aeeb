package dbz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Worker is the REST API of one Kafka Connect worker, e.g. http://127.0.0.1:8083.
type Worker struct {
	URL    string
	Client *http.Client // http.DefaultClient when nil
}

// RefusedError is Connect's answer to a connector configuration it does not accept: its HTTP
// status and its message, word for word.
type RefusedError struct {
	Status  int
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("Kafka Connect refused the connector (HTTP %d): %s", e.Status, e.Message)
}

func (w Worker) client() *http.Client {
	if w.Client != nil {
		return w.Client
	}
	return http.DefaultClient
}

// WaitReady polls the worker's root resource until it answers (the REST server is up; a
// distributed worker answers once it has joined its group and read its config topic) or ctx ends.
// alive tells a worker that exited from one still starting.
func (w Worker) WaitReady(ctx context.Context, alive func() bool) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL+"/connectors", nil)
		if err != nil {
			return err
		}
		resp, err := w.client().Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !alive() {
			return errors.New("the Connect worker exited before its REST API answered")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the Connect worker at %s did not answer: %w", w.URL, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CreateConnector creates a connector; a configuration Connect refuses comes back as a
// *RefusedError carrying Connect's message.
func (w Worker) CreateConnector(ctx context.Context, name string, config map[string]string) error {
	body, err := json.Marshal(map[string]any{"name": name, "config": config})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/connectors", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client().Do(req)
	if err != nil {
		return fmt.Errorf("create connector %s: %w", name, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(msg, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(msg))
	}
	return &RefusedError{Status: resp.StatusCode, Message: e.Message}
}

// TaskState is the state of a connector's first task (RUNNING, FAILED, ...) and, when it
// failed, Connect's trace; "" while it has no task yet.
func (w Worker) TaskState(ctx context.Context, name string) (state, trace string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL+"/connectors/"+name+"/status", nil)
	if err != nil {
		return "", "", err
	}
	resp, err := w.client().Do(req)
	if err != nil {
		return "", "", fmt.Errorf("status of connector %s: %w", name, err)
	}
	defer resp.Body.Close()
	var st struct {
		Connector struct {
			State string `json:"state"`
			Trace string `json:"trace"`
		} `json:"connector"`
		Tasks []struct {
			State string `json:"state"`
			Trace string `json:"trace"`
		} `json:"tasks"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", nil // not registered yet
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", "", fmt.Errorf("status of connector %s: %w", name, err)
	}
	if st.Connector.State == "FAILED" {
		return "FAILED", st.Connector.Trace, nil
	}
	if len(st.Tasks) == 0 {
		return "", "", nil
	}
	return st.Tasks[0].State, st.Tasks[0].Trace, nil
}
