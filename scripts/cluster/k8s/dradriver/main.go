// Command dradriver runs Kubernetes' own DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver,
// package app) as the kubelet plugin of one node, publishing the devices of a file instead of the
// attribute-less "device-NN" devices its own command line offers.
//
// The node of `make test-node` (docs/cluster-tests.md) runs it under the NVIDIA driver's name,
// gpu.nvidia.com, with devices shaped like MIG slices (type, profile, productName, uuid,
// parentUUID, memory and multiprocessors), so that draslice's DeviceClasses, claim templates and
// preflight select them as they would select the NVIDIA driver's. Everything a driver does with an
// allocated claim is the test driver's own code: it writes a CDI spec per claim whose only edits
// are environment variables (claim_<claim>_<request>=true, and the string parameters of opaque
// configs addressed to it), and the kubelet hands those to the container through containerd.
//
// Usage:
//
//	dradriver --kubeconfig K --node-name N --devices devices.json [--driver-name gpu.nvidia.com]
//	          [--cdi-dir D] [--plugin-registration-path P] [--datadir D]
//
// devices.json is a JSON list of slices, each {"devices": [<resource.k8s.io/v1 Device>...],
// "sharedCounters": [<CounterSet>...]}, all published in one pool named after the node.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

type sliceFile struct {
	Devices        []resourceapi.Device     `json:"devices"`
	SharedCounters []resourceapi.CounterSet `json:"sharedCounters,omitempty"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dradriver:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (required)")
	nodeName := flag.String("node-name", "", "the node whose kubelet this plugin serves (required)")
	devicesPath := flag.String("devices", "", "JSON list of slices to publish (required)")
	driverName := flag.String("driver-name", "gpu.nvidia.com", "the DRA driver name to register and publish under")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the CDI spec of each prepared claim is written")
	registry := flag.String("plugin-registration-path", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration folder")
	pluginsDir := flag.String("datadir", kubeletplugin.KubeletPluginsDir, "the folder under which the plugin's socket folder is made")
	version := flag.Bool("version", false, "print the Kubernetes release this driver was built from and exit")
	klog.InitFlags(nil)
	flag.Parse()
	if *version {
		fmt.Println(kubernetesVersion())
		return nil
	}
	for name, value := range map[string]string{"--kubeconfig": *kubeconfig, "--node-name": *nodeName, "--devices": *devicesPath} {
		if value == "" {
			return fmt.Errorf("%s is required", name)
		}
	}

	raw, err := os.ReadFile(*devicesPath)
	if err != nil {
		return err
	}
	var files []sliceFile
	if err := json.Unmarshal(raw, &files); err != nil {
		return fmt.Errorf("%s: %w", *devicesPath, err)
	}
	slices := make([]resourceslice.Slice, 0, len(files))
	count := 0
	for _, f := range files {
		slices = append(slices, resourceslice.Slice{Devices: f.Devices, SharedCounters: f.SharedCounters})
		count += len(f.Devices)
	}

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	for _, dir := range []string{*cdiDir, *registry, *pluginsDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx = klog.NewContext(ctx, klog.Background())
	resources := resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{*nodeName: {Slices: slices}},
	}
	plugin, err := app.StartPlugin(ctx, *cdiDir, *driverName, client, *nodeName,
		app.FileOperations{DriverResources: &resources},
		app.Options{EnableHealthService: false},
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(*pluginsDir, *driverName)),
		kubeletplugin.RegistrarDirectoryPath(*registry),
	)
	if err != nil {
		return err
	}
	defer plugin.Stop()

	// The line the node's tests wait for: the driver's slices exist in the API server.
	if err := waitPublished(ctx, client, *driverName, *nodeName, count); err != nil {
		return err
	}
	fmt.Printf("dra driver %s: %d devices published\n", *driverName, count)
	<-ctx.Done()
	return nil
}

func waitPublished(ctx context.Context, client kubernetes.Interface, driver, node string, want int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + driver + "," +
				resourceapi.ResourceSliceSelectorNodeName + "=" + node,
		})
		if err == nil {
			got := 0
			for _, s := range list.Items {
				got += len(s.Spec.Devices)
			}
			if got == want {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the driver's %d devices were not published within 60 s (last error: %v)", want, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// kubernetesVersion is the release stamped into the binary by scripts/node/build.sh, as the
// release build stamps the kubelet's.
func kubernetesVersion() string {
	return version.Get().GitVersion
}
