/* Locating the virtio-serial port by name. The kernel announces ports asynchronously after
 * virtio_console binds, so callers retry; devtmpfs normally creates /dev/vportNpM, and we
 * create the node ourselves from sysfs when it did not. */
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define SYS_PORTS "/sys/class/virtio-ports"

static int ensure_node(const char *devname)
{
	char path[300], devfile[300], buf[64];
	struct stat st;
	unsigned maj, min;
	snprintf(path, sizeof(path), "/dev/%s", devname);
	if (stat(path, &st) == 0 && S_ISCHR(st.st_mode))
		return 0;
	snprintf(devfile, sizeof(devfile), SYS_PORTS "/%s/dev", devname);
	if (read_small_file(devfile, buf, sizeof(buf)) <= 0 || sscanf(buf, "%u:%u", &maj, &min) != 2)
		return -1;
	if (mknod(path, S_IFCHR | 0600, makedev(maj, min)) < 0 && errno != EEXIST)
		return -1;
	logmsg("created %s (%u:%u)", path, maj, min);
	return 0;
}

int port_open(void)
{
	DIR *d = opendir(SYS_PORTS);
	struct dirent *e;
	int fd = -1;
	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL) {
		char namefile[300], name[128], path[300];
		if (e->d_name[0] == '.')
			continue;
		snprintf(namefile, sizeof(namefile), SYS_PORTS "/%s/name", e->d_name);
		if (read_small_file(namefile, name, sizeof(name)) <= 0)
			continue;
		name[strcspn(name, "\n")] = '\0';
		if (strcmp(name, PORT_NAME) != 0)
			continue;
		if (ensure_node(e->d_name) < 0)
			break;
		snprintf(path, sizeof(path), "/dev/%s", e->d_name);
		/* Non-blocking: with no host connected a write would otherwise wait forever. */
		fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (fd >= 0)
			logmsg("opened %s (%s)", path, PORT_NAME);
		break;
	}
	closedir(d);
	return fd;
}
