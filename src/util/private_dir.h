// A per-user directory only its owner can use (0700), for files other processes of the same
// user read (the sysfs view, the statistics files). Created if missing; trusted only if it is
// a real directory (not a symlink), owned by us, with no group or other permissions, so no
// other user can plant or read anything in it.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace sv {

inline bool own_private_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
         (st.st_mode & 077) == 0;
}

}  // namespace sv
