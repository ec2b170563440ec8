// Runs every builder primitive once through the real plugin: a quick check of the runtime
// without torch. Usage: pjrt_smoke <plugin.so>
#include <cstdio>
#include <vector>

#include "hlo/hlo_builder.h"
#include "pjrt/pjrt_runtime.h"

using namespace torchtpu::rt;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <pjrt plugin .so>\n", argv[0]);
    return 2;
  }
  Runtime rt(argv[1], "");
  std::printf("platform %s %s, %d devices, API %d.%d\n", rt.platform_name().c_str(), rt.platform_version().c_str(),
              rt.device_count(), rt.api_major(), rt.api_minor());
  Builder b;
  TensorType t{ElementType::F32, {2, 3}};
  Value x = b.parameter(t);
  Value y = b.parameter(TensorType{ElementType::F32, {3}});
  Value z = b.relu(b.add(b.mul(x, y), b.scalar_like(1.5, x)));
  Value s = b.sum(z, {1}, true);
  Value m = b.mean(z, {}, false);
  Value mm = b.matmul(x, b.transpose(x, {1, 0}));
  Value c = b.convert(b.lt(x, b.scalar_like(2, x)), ElementType::F32);
  Value w = b.where(b.eq(x, x), b.exp(x), b.neg(x));
  Value g = b.read_view(x, ViewGeometry{{3, 2}, {1, 3}, 0});
  Value g2 = b.read_view(x, ViewGeometry{{2, 2}, {3, 2}, 0});
  Value wv = b.write_view(&x, t, b.full(0, TensorType{ElementType::F32, {2}}), ViewGeometry{{2}, {3}, 0});
  Value cat = b.cat({x, x}, 0);
  Value half = b.convert(b.sqrt(b.log(b.add(x, b.scalar_like(3, x)))), ElementType::BF16);
  std::vector<Value> outs{z, s, m, mm, c, w, g, g2, wv, cat, half};
  std::vector<TensorType> types;
  for (auto& v : outs) types.push_back(v.type);
  const std::string text = b.finish(outs);
  auto exe = rt.compile(text, types);
  std::vector<float> xs{0, 1, 2, 3, 4, 5}, ys{1, -1, 2};
  auto bx = rt.to_device(xs.data(), ElementType::F32, {2, 3}, 0);
  auto by = rt.to_device(ys.data(), ElementType::F32, {3}, 0);
  auto results = rt.execute(*exe, {bx->raw(), by->raw()}, 0);
  std::vector<float> host(6);
  rt.to_host(*results[8], host.data(), 24);
  std::printf("write_view: %g %g %g %g %g %g\n", host[0], host[1], host[2], host[3], host[4], host[5]);
  rt.to_host(*results[6], host.data(), 24);
  std::printf("transpose view: %g %g %g %g %g %g\n", host[0], host[1], host[2], host[3], host[4], host[5]);
  rt.to_host(*results[7], host.data(), 16);
  std::printf("strided view: %g %g %g %g\n", host[0], host[1], host[2], host[3]);
  if (rt.device_count() > 1) {
    auto b1 = rt.to_device(xs.data(), ElementType::F32, {2, 3}, 1);
    auto b2 = rt.to_device(ys.data(), ElementType::F32, {3}, 1);
    auto r1 = rt.execute(*exe, {b1->raw(), b2->raw()}, 1);
    rt.to_host(*r1[1], host.data(), 8);
    std::printf("on device 1: %g %g\n", host[0], host[1]);
  }
  rt.synchronize();
  std::printf("ok\n");
  return 0;
}
