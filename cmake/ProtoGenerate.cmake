# taskgrid_proto_generate(<target> PROTO_ROOT <dir> PROTOS <rel.proto>... [GRPC])
# Runs protoc on each proto (paths relative to PROTO_ROOT) and adds the
# generated sources to <target>. With GRPC, only the *.grpc.pb.cc service
# code is added (the messages live in a gRPC-free target of their own).
function(taskgrid_proto_generate target)
  cmake_parse_arguments(ARG "GRPC" "PROTO_ROOT;OUT_DIR" "PROTOS" ${ARGN})
  set(out_dir ${ARG_OUT_DIR})
  file(MAKE_DIRECTORY ${out_dir})
  set(srcs)
  foreach(rel IN LISTS ARG_PROTOS)
    string(REGEX REPLACE "\\.proto$" "" stem ${rel})
    if(ARG_GRPC)
      set(gen ${out_dir}/${stem}.grpc.pb.cc ${out_dir}/${stem}.grpc.pb.h)
      add_custom_command(
        OUTPUT ${gen}
        COMMAND protobuf::protoc -I ${ARG_PROTO_ROOT} --grpc_out=${out_dir}
                --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin> ${rel}
        WORKING_DIRECTORY ${ARG_PROTO_ROOT}
        DEPENDS ${ARG_PROTO_ROOT}/${rel} protobuf::protoc gRPC::grpc_cpp_plugin
        COMMENT "protoc (grpc) ${rel}"
        VERBATIM)
    else()
      set(gen ${out_dir}/${stem}.pb.cc ${out_dir}/${stem}.pb.h)
      add_custom_command(
        OUTPUT ${gen}
        COMMAND protobuf::protoc -I ${ARG_PROTO_ROOT} --cpp_out=${out_dir} ${rel}
        WORKING_DIRECTORY ${ARG_PROTO_ROOT}
        DEPENDS ${ARG_PROTO_ROOT}/${rel} protobuf::protoc
        COMMENT "protoc (cpp) ${rel}"
        VERBATIM)
    endif()
    list(APPEND srcs ${gen})
  endforeach()
  target_sources(${target} PRIVATE ${srcs})
  target_include_directories(${target} SYSTEM PUBLIC ${out_dir})
endfunction()
