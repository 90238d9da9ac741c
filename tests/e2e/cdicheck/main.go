// Command cdicheck is the test suite's window into the Go CDI library that
// podman 4.3 and containerd embed (Debian's package, version 0.5.x). It lets
// the Python tests compare cdi-gen's verdicts with the library's own, and
// inject devices into an OCI config for runc exactly as a runtime would.
//
// Usage:
//
//	cdicheck list DIR...                     registry view of spec folders (later folder wins)
//	cdicheck validate FILE...                load each file on its own
//	cdicheck inject CONFIG DIRS NAME...      inject devices into an OCI config.json in place
//	                                         (DIRS is a colon-separated folder list)
//
// Every mode prints one JSON document on stdout. A panic inside the library
// (0.5.2 panics on one-character vendor or class names) is caught and reported
// as "panic" rather than crashing, because the tests want to see it.
package main

import (
	"encoding/json"
	"fmt"
	"io/ioutil"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/container-orchestrated-devices/container-device-interface/pkg/cdi"
	oci "github.com/opencontainers/runtime-spec/specs-go"
)

type listResult struct {
	Devices   map[string]string   `json:"devices"`
	Errors    map[string][]string `json:"errors"`
	Conflicts []string            `json:"conflicts"`
	Panic     string              `json:"panic,omitempty"`
}

type fileResult struct {
	OK      bool     `json:"ok"`
	Error   string   `json:"error,omitempty"`
	Panic   string   `json:"panic,omitempty"`
	Kind    string   `json:"kind,omitempty"`
	Devices []string `json:"devices"`
}

type injectResult struct {
	Unresolved []string `json:"unresolved"`
	Error      string   `json:"error,omitempty"`
}

// The library keeps conflicting names only inside its error messages.
var conflictRe = regexp.MustCompile(`conflicting device "([^"]+)"`)

func list(dirs []string) (res listResult) {
	res = listResult{Devices: map[string]string{}, Errors: map[string][]string{}, Conflicts: []string{}}
	defer func() {
		if r := recover(); r != nil {
			res.Panic = fmt.Sprint(r)
		}
	}()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		res.Panic = "NewCache: " + err.Error()
		return res
	}
	for _, name := range cache.ListDevices() {
		res.Devices[name] = cache.GetDevice(name).GetSpec().GetPath()
	}
	seen := map[string]bool{}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			msg := e.Error()
			res.Errors[path] = append(res.Errors[path], msg)
			for _, m := range conflictRe.FindAllStringSubmatch(msg, -1) {
				if !seen[m[1]] {
					seen[m[1]] = true
					res.Conflicts = append(res.Conflicts, m[1])
				}
			}
		}
	}
	sort.Strings(res.Conflicts)
	return res
}

func validateOne(path string) (res fileResult) {
	res = fileResult{Devices: []string{}}
	defer func() {
		if r := recover(); r != nil {
			res.OK = false
			res.Panic = fmt.Sprint(r)
		}
	}()
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.OK = true
	res.Kind = spec.Kind
	for _, d := range spec.Devices {
		res.Devices = append(res.Devices, cdi.QualifiedName(spec.GetVendor(), spec.GetClass(), d.Name))
	}
	return res
}

func inject(configPath string, dirs []string, names []string) (res injectResult, code int) {
	res = injectResult{Unresolved: []string{}}
	data, err := ioutil.ReadFile(configPath)
	if err != nil {
		res.Error = err.Error()
		return res, 2
	}
	var spec oci.Spec
	if err = json.Unmarshal(data, &spec); err != nil {
		res.Error = err.Error()
		return res, 2
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		res.Error = err.Error()
		return res, 2
	}
	unresolved, err := cache.InjectDevices(&spec, names...)
	if unresolved != nil {
		res.Unresolved = unresolved
	}
	if err != nil {
		res.Error = err.Error()
		return res, 1
	}
	out, err := json.MarshalIndent(&spec, "", "  ")
	if err == nil {
		err = ioutil.WriteFile(configPath, out, 0o644)
	}
	if err != nil {
		res.Error = err.Error()
		return res, 2
	}
	return res, 0
}

func emit(v interface{}) {
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(string(out))
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cdicheck list DIR... | validate FILE... | inject CONFIG DIR[:DIR...] NAME...")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "list":
		emit(list(args))
	case "validate":
		files := map[string]fileResult{}
		for _, path := range args {
			files[path] = validateOne(path)
		}
		emit(map[string]interface{}{"files": files})
	case "inject":
		if len(args) < 3 {
			usage()
		}
		res, code := inject(args[0], strings.Split(args[1], ":"), args[2:])
		emit(res)
		os.Exit(code)
	default:
		usage()
	}
}
