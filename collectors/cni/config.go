package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// netConf is what the check needs from a CNI network configuration file.
type netConf struct {
	// Name is the network name.
	Name string
	// CNIVersion is the spec version the file declares (cniVersion, or the cniVersions list
	// joined with commas).
	CNIVersion string
	// Types are the plugin types in invocation order; each names an executable in the CNI
	// binary directory.
	Types []string
	// PluginsFromDir is set for a .conflist without a "plugins" key: since CNI spec 1.1 its
	// plugins live in <conf dir>/<Name>/*.conf.
	PluginsFromDir bool
}

// configExtensions are the file extensions the container runtime considers in the CNI conf
// directory (containerd's go-cni passes exactly these to libcni.ConfFiles).
var configExtensions = []string{".conf", ".conflist", ".json"}

// isConfigFile reports whether a file name is one the runtime would consider.
func isConfigFile(name string) bool {
	ext := filepath.Ext(name)
	for _, e := range configExtensions {
		if ext == e {
			return true
		}
	}
	return false
}

// parseConfig parses one network configuration file as the runtime would: a .conflist is a
// named list of plugins, a .conf or .json is a single plugin whose own "type" is run. name is
// the file name (its extension selects the format); data its content. It returns an error
// saying what is wrong for anything the runtime would refuse or could not run: not a JSON
// object, no name, no cniVersion, an empty plugin list, a plugin without a usable type.
func parseConfig(name string, data []byte) (netConf, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return netConf{}, fmt.Errorf("not valid JSON: %w", err)
	}
	if raw == nil {
		return netConf{}, errors.New("not a JSON object")
	}
	var nc netConf
	var err error
	if nc.Name, err = stringField(raw, "name"); err != nil {
		return netConf{}, err
	}
	if nc.Name == "" {
		return netConf{}, errors.New(`missing "name"`)
	}
	if nc.CNIVersion, err = version(raw); err != nil {
		return netConf{}, err
	}

	switch filepath.Ext(name) {
	case ".conflist":
		plugins, ok := raw["plugins"]
		if !ok {
			inlinedOnly, err := boolField(raw, "loadOnlyInlinedPlugins")
			if err != nil {
				return netConf{}, err
			}
			if inlinedOnly {
				return netConf{}, errors.New(`no "plugins" list although loadOnlyInlinedPlugins is true`)
			}
			nc.PluginsFromDir = true
			return nc, nil
		}
		var list []json.RawMessage
		if err := json.Unmarshal(plugins, &list); err != nil {
			return netConf{}, fmt.Errorf(`"plugins" is not a list: %w`, err)
		}
		if len(list) == 0 {
			return netConf{}, errors.New(`empty "plugins" list`)
		}
		nc.Types = make([]string, 0, len(list))
		for i, p := range list {
			t, err := pluginType(p)
			if err != nil {
				return netConf{}, fmt.Errorf("plugin %d: %w", i, err)
			}
			nc.Types = append(nc.Types, t)
		}
	case ".conf", ".json":
		t, err := typeField(raw)
		if err != nil {
			if _, hasList := raw["plugins"]; hasList {
				err = fmt.Errorf(`%w (a "plugins" list belongs in a .conflist file)`, err)
			}
			return netConf{}, err
		}
		nc.Types = []string{t}
	default:
		return netConf{}, fmt.Errorf("extension %q is not one of %s", filepath.Ext(name), strings.Join(configExtensions, ", "))
	}
	return nc, nil
}

// pluginType returns the validated type of one plugin object: an element of a conflist's
// "plugins", or a file of a CNI 1.1 plugin directory.
func pluginType(data []byte) (string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return "", fmt.Errorf("not valid JSON: %w", err)
	}
	if raw == nil {
		return "", errors.New("not a JSON object")
	}
	return typeField(raw)
}

func typeField(raw map[string]json.RawMessage) (string, error) {
	t, err := stringField(raw, "type")
	if err != nil {
		return "", err
	}
	if err := validType(t); err != nil {
		return "", err
	}
	return t, nil
}

// validType rejects plugin types the runtime could not look up as a file in the binary
// directory, and ones that would point outside it.
func validType(t string) error {
	switch {
	case t == "":
		return errors.New(`missing "type"`)
	case t == "." || t == ".." || strings.ContainsAny(t, "/\\\x00"):
		return fmt.Errorf("plugin type %q is not a file name", t)
	}
	return nil
}

// stringField returns a string member; absent and null read as "".
func stringField(raw map[string]json.RawMessage, key string) (string, error) {
	v, ok := raw[key]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("%q is not a string", key)
	}
	return s, nil
}

// boolField reads a flag the way libcni does: a JSON bool or the strings "true"/"false".
func boolField(raw map[string]json.RawMessage, key string) (bool, error) {
	v, ok := raw[key]
	if !ok {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(v, &b); err == nil {
		return b, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		switch strings.ToLower(s) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
	}
	return false, fmt.Errorf("%q is not a boolean", key)
}

// version returns the declared spec version: cniVersion, else the non-empty cniVersions.
func version(raw map[string]json.RawMessage) (string, error) {
	v, err := stringField(raw, "cniVersion")
	if err != nil || v != "" {
		return v, err
	}
	if list, ok := raw["cniVersions"]; ok {
		var vs []string
		if err := json.Unmarshal(list, &vs); err != nil {
			return "", errors.New(`"cniVersions" is not a list of strings`)
		}
		var kept []string
		for _, s := range vs {
			if s != "" {
				kept = append(kept, s)
			}
		}
		if len(kept) > 0 {
			return strings.Join(kept, ","), nil
		}
	}
	return "", errors.New(`missing "cniVersion"`)
}
