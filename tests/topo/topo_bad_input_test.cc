// Bad input: missing or unreadable files, garbage, a root that is not a sysfs tree. Discovery
// gives a clear error or an "unknown" entry, never a crash.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "temp_dir.h"
#include "topo/distance.h"
#include "topo/report.h"
#include "topo/sysfs.h"
#include "topo/topo_fixture.h"

namespace dmx::topo {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

TEST(TopoBadInput, MissingRootIsNotFound) {
  auto t = discover(std::string("/nonexistent/dmx/sysfs"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/dmx/sysfs"), std::string::npos);
}

TEST(TopoBadInput, NotASysfsTree) {
  TempDir d;
  test::write_file(fs::path(d.path()) / "hello.txt", "not sysfs");
  auto t = discover(d.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_NE(t.status().message().find("not a sysfs tree"), std::string::npos) << t.status().message();
  auto f = discover(d.path() + "/hello.txt");  // a file, not a directory
  EXPECT_FALSE(f.ok());
}

TEST(TopoBadInput, EmptyDevicesIsAnEmptyMachineWithAWarning) {
  TempDir d;
  fs::create_directories(fs::path(d.path()) / "devices");
  auto t = discover(d.path());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(t->devices.empty());
  EXPECT_FALSE(t->warnings.empty());
  EXPECT_EQ(t->cpu.vendor, "unknown");
  EXPECT_FALSE(cpu_supports_p2pdma(t->cpu));
  EXPECT_FALSE(render_text(*t).empty());
  EXPECT_FALSE(render_json(*t).empty());
}

TEST(TopoBadInput, GarbageMissingAndUnreadableAttributes) {
  TempDir d;
  fs::copy(testing::fixture_root("gpu-vm"), d.path(), fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  fs::path root(d.path());
  fs::path gpu0 = root / "devices/pci0000:00/0000:00:06.0";
  fs::path gpu1 = root / "devices/pci0000:00/0000:00:07.0";
  test::write_file(gpu0 / "vendor", "zzz-not-hex");
  test::write_file(gpu0 / "numa_node", "banana");
  test::write_file(gpu0 / "max_link_width", "99999999999999999999");
  test::write_file(gpu0 / "config", "short");
  fs::remove(gpu1 / "class");
  fs::create_directories(gpu1 / "class");  // read() fails with EISDIR
  fs::remove(gpu1 / "config");
  fs::create_directories(gpu1 / "config");
  test::write_file(root / "devices/system/cpu/modalias", "garbage");
  fs::create_symlink("../../devices/nowhere/net/eth9", root / "class/net/eth9");  // dangling
  fs::create_symlink("/etc", root / "class/net/eth8");                            // outside the root
  fs::create_directories(root / "devices/pci0000:00/0000:00:1f.7");               // no files at all
  fs::create_directories(root / "devices/pci0000:00/not-a-bdf");
  test::write_file(root / "devices/system/node/node0/distance", "10 x 99999");
  auto t = discover(d.path());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  int g0 = t->find("0000:00:06.0"), g1 = t->find("0000:00:07.0"), empty = t->find("0000:00:1f.7");
  ASSERT_GE(g0, 0);
  ASSERT_GE(g1, 0);
  ASSERT_GE(empty, 0);
  EXPECT_FALSE(t->devices[g0].ids_known);
  EXPECT_EQ(t->devices[g0].kind, DeviceKind::kOther);
  EXPECT_EQ(t->devices[g0].numa_node, -1);
  EXPECT_EQ(t->devices[g0].link.max_width, -1);
  EXPECT_FALSE(t->devices[g0].problems.empty());
  EXPECT_FALSE(t->devices[g1].ids_known);
  EXPECT_FALSE(t->devices[g1].acs_redirects().has_value());  // config unreadable: unknown
  EXPECT_FALSE(t->devices[empty].ids_known);
  EXPECT_EQ(t->cpu.vendor, "unknown");
  EXPECT_GE(t->warnings.size(), 4u);
  EXPECT_EQ(t->nic_by_name("eth9"), -1);
  EXPECT_EQ(t->nic_by_name("eth8"), -1);
  EXPECT_GE(t->nic_by_name("eth0"), 0);
  // The rule still answers, naming what it could not read.
  P2pdmaResult r = p2pdma_distance(*t, g0, g1);
  EXPECT_EQ(r.distance, 2);
  EXPECT_EQ(r.map, MapType::kNotSupported);  // CPU unknown, host bridge 0d57 not whitelisted
  EXPECT_FALSE(r.acs_unknown.empty());
  EXPECT_NE(r.reason.find("ACS state unknown"), std::string::npos) << r.reason;
  EXPECT_FALSE(render_text(*t).empty());
  EXPECT_FALSE(render_json(*t).empty());
  EXPECT_EQ(p2pdma_distance(*t, -1, g0).map, MapType::kUnknown);
  EXPECT_EQ(path_class(*t, g0, 12345).cls, PathClass::kUnknown);
}

TEST(TopoBadInput, ConfigParserSurvivesGarbage) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 3000; ++i) {
    size_t len = rng() % 4200;
    std::string b(len, '\0');
    for (char& c : b) c = static_cast<char>(rng());
    if (len > 0x40 && (i % 3) == 0) b[0x06] = 0x10;  // often claim a capability list
    ConfigInfo info = parse_config(b);
    EXPECT_EQ(info.length, len);
  }
  // A capability list that points at itself, and an extended one that loops.
  std::string loop(4096, '\0');
  loop[0x06] = 0x10;
  loop[0x34] = 0x40;
  loop[0x40] = 0x05;
  loop[0x41] = 0x40;
  loop[0x100] = 0x0d;
  loop[0x102] = 0x01;
  loop[0x103] = 0x10;  // next = 0x100
  ConfigInfo info = parse_config(loop);
  EXPECT_TRUE(info.has_acs);
}

TEST(TopoBadInput, PciAddressParsing) {
  EXPECT_TRUE(PciAddress::parse("0000:00:1f.7").has_value());
  EXPECT_EQ(PciAddress::parse("0001:82:00.0")->to_string(), "0001:82:00.0");
  EXPECT_FALSE(PciAddress::parse("0000:00:20.0").has_value());  // device > 31
  EXPECT_FALSE(PciAddress::parse("0000:00:00.8").has_value());
  EXPECT_FALSE(PciAddress::parse("pci0000:00").has_value());
  EXPECT_FALSE(PciAddress::parse("0000:zz:00.0").has_value());
  EXPECT_FALSE(PciAddress::parse("").has_value());
}

TEST(TopoCapture, CaptureReplaysTheSameTopology) {
  SysfsTree tree(testing::fixture_root("switch-cascade-amd"));
  tree.set_recording(true);
  auto before = discover(tree);
  ASSERT_TRUE(before.ok());
  TempDir d;
  std::string dest = d.path() + "/cap";
  ASSERT_TRUE(capture_tree(tree, dest).ok());
  auto after = discover(dest);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  ASSERT_EQ(after->devices.size(), before->devices.size());
  EXPECT_EQ(after->nics.size(), before->nics.size());
  EXPECT_EQ(after->devices[after->find("0000:07:00.2")].physfn, after->find("0000:07:00.0"));
  std::string a = render_text(*before), b = render_text(*after);
  EXPECT_EQ(a.substr(a.find('\n')), b.substr(b.find('\n')));  // all but the root line
}

}  // namespace
}  // namespace dmx::topo
