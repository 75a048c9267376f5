# storage/policy.cmake: the eviction policy as its own small library, metadata only, so the
# hit-rate simulator (bench/hitrate) and its tests link the very code lazykvd runs without
# pulling in the arena, RocksDB or gRPC. Included once, by whichever folder needs it first.
if(NOT TARGET lkv_policy)
  add_library(lkv_policy STATIC ${CMAKE_SOURCE_DIR}/storage/lkv_policy.c)
  target_include_directories(lkv_policy PUBLIC ${CMAKE_SOURCE_DIR}/storage)
  target_link_libraries(lkv_policy PUBLIC lkv_common m) # m: pow, sqrt (the climber)
endif()
