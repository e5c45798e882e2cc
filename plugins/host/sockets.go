package host

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// go-plugin makes a folder for each plugin process's Unix socket
// (plugin-dir*, PLUGIN_UNIX_SOCKET_DIR) and removes it when it kills the
// plugin; a dflow that is SIGKILLed removes nothing. So the folders go
// in one folder of this host's, dflow-plugins-PID-*, under the system's
// temporary folder: Close removes it, and a host that starts its first
// plugin removes those of processes that no longer exist (dflows
// killed), whatever they left in them.

// maxSocketPath is the room for a Unix socket's path (108 bytes on
// Linux, 104 on the BSDs and macOS), less its terminating zero.
const maxSocketPath = 103

// socketPrefix names a host's folder of socket folders: PREFIX-PID-RANDOM.
const socketPrefix = "dflow-plugins-"

// socketDir is the host's folder of socket folders, made (after sweeping
// dead hosts' folders) on first use; "" if it could not be made, and
// go-plugin then uses the temporary folder itself. Called with h.mu held.
func (h *Host) socketDir() string {
	if h.sockets == "" {
		tmp := h.tempDir
		if tmp == "" {
			tmp = os.TempDir()
		}
		sweepSockets(tmp)
		dir, err := os.MkdirTemp(tmp, fmt.Sprintf("%s%d-", socketPrefix, os.Getpid()))
		if err == nil && len(dir)+len("/plugin-dir0123456789/plugin0123456789") >= maxSocketPath {
			// A socket's path is bounded (sun_path): a long TMPDIR leaves
			// no room for this folder; go-plugin's own then.
			os.Remove(dir)
			err = fmt.Errorf("%s: too long a path for sockets", dir)
		}
		if err == nil {
			h.sockets = dir
		}
	}
	return h.sockets
}

// sweepSockets removes the folders of socket folders in tmp whose dflow
// process no longer exists.
func sweepSockets(tmp string) {
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), socketPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() || processExists(pid) {
			continue
		}
		os.RemoveAll(filepath.Join(tmp, e.Name()))
	}
}
