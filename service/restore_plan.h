// The part of a restore that needs no cluster: which tensors it reads and in
// which layout, from what the checkpoint holds, the request and the target mesh.
// StartRestore runs it at the door, so a restore that cannot work is a 400, never
// a job that fails.
#pragma once

#include <string>
#include <vector>

#include "api/mesh.h"
#include "api/requests.h"
#include "api/status.h"
#include "api/tensor_desc.h"

namespace tessera::service {

// The saved layout carried over to `mesh`: axes the mesh lacks, or that do not
// divide the dimension, become unsharded.
Layout AdaptLayout(const Layout& saved, const Shape& shape, const Mesh& mesh);

// The tensors to read, in the order asked for (all of `saved`, in its order, when
// the request names none), each in its target layout: the request's layout for
// it, checked against `target`, else the saved one adapted. invalid_argument
// naming the tensor and the field (tensors, dtype, shape, layouts) for a tensor the
// checkpoint (`what`, e.g. "checkpoint m step 3") lacks, a dtype or shape the
// caller did not expect, or a layout that does not fit the target mesh.
Result<std::vector<TensorMeta>> PlanRestoreTensors(const std::vector<TensorMeta>& saved,
                                                   const RestoreRequest& request,
                                                   const Mesh& target, const std::string& what);

}  // namespace tessera::service
