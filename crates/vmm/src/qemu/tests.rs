use super::*;

fn vm() -> QemuCommand {
    let mut q = QemuCommand::new(
        Accel::Tcg,
        256,
        MemoryBackend::SharedFile("/run/x,y/ram".into()),
    )
    .with_crash_devices();
    q.cpus = 2;
    q.boot = Some(Boot {
        kernel: "/img/vmlinuz".into(),
        initrd: Some("/img/initrd".into()),
        append: "console=ttyS0 rebound.workload=web".into(),
    });
    q.disks
        .push(Disk::file("/vms/a/disk0.qcow2", DiskFormat::Qcow2));
    q.nics.push(Nic {
        backend: NetBackend::User {
            forwards: vec![
                HostForward {
                    bind: std::net::Ipv4Addr::LOCALHOST,
                    host: 40001,
                    guest: 8080,
                },
                HostForward {
                    bind: std::net::Ipv4Addr::LOCALHOST,
                    host: 40002,
                    guest: 22,
                },
            ],
        },
        mac: None,
        filters: vec![],
    });
    q.control = Control {
        qmp: Some("/run/x,y/qmp.sock".into()),
        hmp: None,
        agent: Some("/run/x,y/agent.sock".into()),
        serial: Serial::Socket {
            socket: "/run/x,y/serial.sock".into(),
            log: Some("/run/x,y/serial.log".into()),
        },
        pidfile: Some("/run/x,y/qemu.pid".into()),
    };
    q
}

fn after<'a>(a: &'a [String], flag: &str) -> Vec<&'a str> {
    a.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

#[test]
fn memory_is_a_shared_file() {
    let a = vm().args().unwrap();
    assert_eq!(after(&a, "-machine"), ["pc,memory-backend=ram"]);
    assert_eq!(
        after(&a, "-object"),
        ["memory-backend-file,id=ram,size=256M,mem-path=/run/x,,y/ram,share=on"]
    );
    assert_eq!(after(&a, "-m"), ["256M"]);
    assert_eq!(after(&a, "-smp"), ["2"]);
    assert_eq!(after(&a, "-accel"), ["tcg"]);
}

#[test]
fn memory_backends() {
    let mut q = vm();
    q.memory.backend = MemoryBackend::PrivateImage("/snap/ram.img".into());
    q.incoming = Some(Incoming::Defer);
    let a = q.args().unwrap();
    assert_eq!(
        after(&a, "-object"),
        ["memory-backend-file,id=ram,size=256M,mem-path=/snap/ram.img,share=off"]
    );
    assert_eq!(after(&a, "-incoming"), ["defer"]);
    q.memory.backend = MemoryBackend::Memfd { share: true };
    let a = q.args().unwrap();
    assert_eq!(
        after(&a, "-object"),
        ["memory-backend-memfd,id=ram,size=256M,share=on"]
    );
    q.memory.backend = MemoryBackend::Anonymous;
    let a = q.args().unwrap();
    assert!(after(&a, "-object").is_empty());
    assert_eq!(after(&a, "-machine"), ["pc"]);
    q.machine = Machine::Q35;
    assert_eq!(after(&q.args().unwrap(), "-machine"), ["q35"]);
}

#[test]
fn crash_devices_pause() {
    let a = vm().args().unwrap();
    assert_eq!(after(&a, "-action"), ["panic=pause", "watchdog=pause"]);
    let dev = after(&a, "-device");
    assert!(dev.contains(&"pvpanic"));
    assert!(dev.contains(&"vmcoreinfo"));
    assert!(dev.contains(&"i6300esb,id=watchdog0"));
    assert!(dev.contains(&"virtio-balloon-pci,id=balloon0"));
    // Twice the same single device would collide on its id.
    let mut q = vm();
    q.devices.push(Device::Balloon);
    assert!(matches!(q.args(), Err(QemuCmdError::DuplicateId(_))));
}

#[test]
fn disks_have_stable_ids() {
    let mut q = vm();
    q.disks.push(Disk {
        backend: BlockBackend::File {
            path: "/crashed/disk0.qcow2".into(),
            format: DiskFormat::Qcow2,
            locking: false,
        },
        readonly: true,
        direct: true,
    });
    let a = q.args().unwrap();
    let bd: Vec<serde_json::Value> = after(&a, "-blockdev")
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
    assert_eq!(bd[0]["driver"], "qcow2");
    assert_eq!(bd[0]["node-name"], "drive0");
    assert_eq!(bd[0]["file"]["filename"], "/vms/a/disk0.qcow2");
    assert_eq!(bd[0]["file"]["locking"], "on");
    assert_eq!(bd[1]["file"]["locking"], "off");
    assert_eq!(bd[1]["read-only"], true);
    assert_eq!(bd[0]["file"]["cache"]["direct"], false);
    assert_eq!(bd[1]["file"]["cache"]["direct"], true);
    assert!(after(&a, "-device").contains(&"virtio-blk-pci,drive=drive0,id=disk0,serial=disk0"));
    assert!(after(&a, "-device").contains(&"virtio-blk-pci,drive=drive1,id=disk1,serial=disk1"));
}

#[test]
fn block_servers() {
    let mut q = vm();
    q.disks = vec![
        Disk {
            backend: BlockBackend::VhostUser {
                socket: "/run/vhost.sock".into(),
            },
            readonly: false,
            direct: false,
        },
        Disk {
            backend: BlockBackend::Nbd {
                socket: "/run/nbd.sock".into(),
                export: "data".into(),
            },
            readonly: false,
            direct: false,
        },
    ];
    let a = q.args().unwrap();
    assert!(after(&a, "-chardev").contains(&"socket,id=vhost0,path=/run/vhost.sock,reconnect=1"));
    assert!(after(&a, "-device").contains(&"vhost-user-blk-pci,chardev=vhost0,id=disk0"));
    let nbd: serde_json::Value = serde_json::from_str(after(&a, "-blockdev")[0]).unwrap();
    assert_eq!(nbd["driver"], "nbd");
    assert_eq!(nbd["server"]["path"], "/run/nbd.sock");
    assert_eq!(nbd["export"], "data");
    // vhost-user needs guest RAM another process can map.
    q.memory.backend = MemoryBackend::PrivateImage("/snap/ram".into());
    assert_eq!(
        q.args(),
        Err(QemuCmdError::VhostUserNeedsSharedRam("disk0".into()))
    );
}

#[test]
fn forwards_and_sockets() {
    let a = vm().args().unwrap();
    assert_eq!(
        after(&a, "-netdev"),
        ["user,id=net0,hostfwd=tcp:127.0.0.1:40001-:8080,hostfwd=tcp:127.0.0.1:40002-:22"]
    );
    let ch = after(&a, "-chardev");
    assert_eq!(ch.len(), 3);
    assert!(ch[0].contains("path=/run/x,,y/agent.sock"));
    assert!(ch[1].contains("path=/run/x,,y/serial.sock"));
    assert!(ch[1].contains("logfile=/run/x,,y/serial.log"));
    // Without a log, QEMU keeps none (the host's client logs).
    let mut q = vm();
    q.control.serial = Serial::Socket {
        socket: "/r/serial.sock".into(),
        log: None,
    };
    let a2 = q.args().unwrap();
    assert_eq!(
        after(&a2, "-chardev")[1],
        "socket,id=serial0,path=/r/serial.sock,server=on,wait=off"
    );
    assert!(ch[2].starts_with("socket,id=qmp0,path=/run/x,,y/qmp.sock,server=on,wait=off"));
    assert_eq!(after(&a, "-mon"), ["chardev=qmp0,mode=control"]);
    assert!(after(&a, "-device")
        .contains(&"virtserialport,bus=vser0.0,chardev=agent0,name=org.rebound.agent"));
    assert_eq!(after(&a, "-pidfile"), ["/run/x,y/qemu.pid"]);
    assert_eq!(after(&a, "-display"), ["none"]);
}

#[test]
fn networks_and_filters() {
    let mut q = vm();
    q.nics = vec![
        Nic {
            backend: NetBackend::StreamUnix {
                path: "/run/sw.sock".into(),
                server: false,
            },
            mac: Some("52:54:00:00:00:02".into()),
            filters: vec![
                NetFilter::Dump {
                    file: "/tmp/a.pcap".into(),
                },
                NetFilter::Buffer { interval_us: 1000 },
            ],
        },
        Nic {
            backend: NetBackend::Tap {
                ifname: "tap0".into(),
            },
            mac: None,
            filters: vec![],
        },
    ];
    let a = q.args().unwrap();
    assert_eq!(
        after(&a, "-netdev"),
        [
            "stream,id=net0,server=off,addr.type=unix,addr.path=/run/sw.sock",
            "tap,id=net1,ifname=tap0,script=no,downscript=no,vnet_hdr=off"
        ]
    );
    assert!(after(&a, "-device")
        .contains(&"virtio-net-pci,netdev=net0,id=nic0,mac=52:54:00:00:00:02,romfile="));
    let objs = after(&a, "-object");
    assert!(objs.contains(&"filter-dump,id=net0-f0,netdev=net0,file=/tmp/a.pcap"));
    assert!(objs.contains(&"filter-buffer,id=net0-f1,netdev=net0,interval=1000"));
}

#[test]
fn hotplug_memory_needs_maxmem() {
    let mut q = vm();
    q.devices.push(Device::VirtioMem {
        backend: MemoryBackend::SharedFile("/run/vmem".into()),
        size_mib: 1536,
        requested_mib: 0,
        block_mib: 2,
    });
    q.devices.push(Device::VirtioPmem {
        path: "/img/pmem.ext4".into(),
        size_mib: 64,
    });
    assert_eq!(q.args(), Err(QemuCmdError::NeedsMaxMem("virtio-mem")));
    q.memory.max_mib = Some(128);
    assert_eq!(
        q.args(),
        Err(QemuCmdError::MaxBelowSize {
            size: 256,
            max: 128
        })
    );
    q.memory.max_mib = Some(2048);
    let a = q.args().unwrap();
    assert_eq!(after(&a, "-m"), ["256M,maxmem=2048M"]);
    let objs = after(&a, "-object");
    assert!(
        objs.contains(&"memory-backend-file,id=vmem0-mem,size=1536M,mem-path=/run/vmem,share=on")
    );
    assert!(objs
        .contains(&"memory-backend-file,id=pmem0-mem,share=on,mem-path=/img/pmem.ext4,size=64M"));
    let dev = after(&a, "-device");
    assert!(
        dev.contains(&"virtio-mem-pci,id=vmem0,memdev=vmem0-mem,requested-size=0M,block-size=2M")
    );
    assert!(dev.contains(&"virtio-pmem-pci,memdev=pmem0-mem,id=pmem0"));
}

#[test]
fn boot_files() {
    let mut q = vm();
    let a = q.args().unwrap();
    assert_eq!(after(&a, "-kernel"), ["/img/vmlinuz"]);
    assert_eq!(after(&a, "-initrd"), ["/img/initrd"]);
    assert_eq!(after(&a, "-append"), ["console=ttyS0 rebound.workload=web"]);
    q.boot.as_mut().unwrap().initrd = None;
    q.disks.clear();
    q.nics.clear();
    let a = q.args().unwrap();
    assert!(after(&a, "-initrd").is_empty());
    assert!(after(&a, "-blockdev").is_empty());
    assert!(after(&a, "-netdev").is_empty());
    q.boot = None;
    q.control = Control {
        hmp: Some("/t/mon".into()),
        serial: Serial::File("/t/serial.log".into()),
        ..Control::default()
    };
    let a = q.args().unwrap();
    assert!(after(&a, "-kernel").is_empty());
    assert_eq!(after(&a, "-serial"), ["file:/t/serial.log"]);
    assert_eq!(after(&a, "-mon"), ["chardev=hmp0,mode=readline"]);
}

#[test]
fn paused_at_start() {
    let mut q = vm();
    assert!(!q.args().unwrap().iter().any(|a| a == "-S"));
    q.paused = true;
    q.incoming = Some(Incoming::Defer);
    let a = q.args().unwrap();
    assert_eq!(a.iter().filter(|a| *a == "-S").count(), 1);
    assert_eq!(after(&a, "-incoming"), ["defer"]);
}
