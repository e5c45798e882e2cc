package wire

import (
	"fmt"
	"os"

	"github.com/dflow-dev/dflow/plugins/proto"
	"golang.org/x/sys/unix"
)

const shmSupported = true

// CreatePools makes a replica's two pools, dflow's side: anonymous memfd
// files (no name in /dev/shm or anywhere else to clean up after a crash),
// sealed at their size so that a plugin cannot shrink one under dflow's
// reads, mapped here read-write (pool 0) and read-only (pool 1). Their
// descriptors stay open until the plugin has attached (Pools.Attached).
func CreatePools(inSize, outSize int64) (*Pools, error) {
	ps := &Pools{pid: os.Getpid()}
	for i, size := range []int64{inSize, outSize} {
		fd, err := unix.MemfdCreate(fmt.Sprintf("dflow-pool-%d", i), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			ps.closeSome()
			return nil, fmt.Errorf("memfd_create: %w", err)
		}
		prot := unix.PROT_READ
		if i == 0 {
			prot |= unix.PROT_WRITE
		}
		mem, err := sizeAndMap(fd, size, prot)
		if err != nil {
			unix.Close(fd)
			ps.closeSome()
			return nil, err
		}
		p := newPool(int32(i), mem, fd)
		if i == 0 {
			ps.In = p
		} else {
			ps.Out = p
		}
	}
	return ps, nil
}

func sizeAndMap(fd int, size int64, prot int) ([]byte, error) {
	if err := unix.Ftruncate(fd, size); err != nil {
		return nil, fmt.Errorf("sizing a pool: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return nil, fmt.Errorf("sealing a pool: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping a pool: %w", err)
	}
	return mem, nil
}

func (ps *Pools) closeSome() {
	for _, p := range []*Pool{ps.In, ps.Out} {
		if p != nil {
			unix.Munmap(p.mem)
			if p.fd >= 0 {
				unix.Close(p.fd)
			}
		}
	}
}

// OpenPools maps the pools dflow offers (Start.pools), the plugin's side:
// pool 0 read-only, pool 1 read-write, through /proc/PID/fd. The files
// are closed at once: the mappings are what the plugin holds.
func OpenPools(m *proto.Pools) (*Pools, error) {
	ps := &Pools{pid: int(m.Pid)}
	for i, spec := range []struct {
		fd   int32
		size int64
	}{{m.InFd, m.InSize}, {m.OutFd, m.OutSize}} {
		flags, prot := unix.O_RDONLY, unix.PROT_READ
		if i == 1 {
			flags, prot = unix.O_RDWR, unix.PROT_READ|unix.PROT_WRITE
		}
		path := fmt.Sprintf("/proc/%d/fd/%d", m.Pid, spec.fd)
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			ps.closeSome()
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Size < spec.size {
			unix.Close(fd)
			ps.closeSome()
			return nil, fmt.Errorf("%s is not a pool of %d bytes", path, spec.size)
		}
		mem, err := unix.Mmap(fd, 0, int(spec.size), prot, unix.MAP_SHARED)
		unix.Close(fd)
		if err != nil {
			ps.closeSome()
			return nil, fmt.Errorf("mapping %s: %w", path, err)
		}
		p := newPool(int32(i), mem, -1)
		if i == 0 {
			ps.In = p
		} else {
			ps.Out = p
		}
	}
	return ps, nil
}

func closeFd(fd int) { unix.Close(fd) }

func unmap(b []byte) { unix.Munmap(b) }
