# MESHRT_SANITIZE=thread | address (AddressSanitizer + UndefinedBehaviorSanitizer) for every target.
# MESHRT_SANITIZER_FLAGS is what an outside consumer (tests/package_test.cmake) must use too.
set(MESHRT_SANITIZER_FLAGS "")
if(MESHRT_SANITIZE STREQUAL "thread")
  set(MESHRT_SANITIZER_FLAGS -fsanitize=thread)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=thread;-g;-O1>")
  add_link_options(-fsanitize=thread)
elseif(MESHRT_SANITIZE STREQUAL "address")
  set(MESHRT_SANITIZER_FLAGS -fsanitize=address,undefined)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined;-g;-O1>")
  add_link_options(-fsanitize=address,undefined)
elseif(NOT MESHRT_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MESHRT_SANITIZE must be thread, address or empty, not '${MESHRT_SANITIZE}'")
endif()
